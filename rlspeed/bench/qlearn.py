"""``qlearn``: aggregate agent-steps/s of tabular Q-learning agents trained in one program
(``num_seeds`` agents vmapped on the fused path), as in seed 002's 30 agents on a GridWorld.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, run_rlspeed, write_results
from rlspeed.bench.compiled import compiled_env_steps_per_s

# (agents, env steps per agent) with one env per agent, as the seed ran them.
FULL = ((1, 2_000_000), (30, 1_000_000), (256, 262_144), (1024, 65_536))
# The quick form keeps the seed's agent counts (1, 30, 1024), each row being three fresh
# processes.
QUICK = ((1, 20_000), (30, 20_000), (1024, 2_048))


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    table = Table(
        "qlearn",
        "Tabular Q-learning on a 5x5 GridWorld: agents trained in one vmapped program",
        [
            "agents",
            "envs_per_agent",
            "agent_steps",
            "wall_time_s",
            "agent_steps_per_s",
            "updates_per_s",
            "mean_score",
            "cached_wall_time_s",
            "cached_agent_steps_per_s",
            "compiled_agent_steps_per_s",
        ],
        notes=[
            "Seed 002: 1.47 M agent-steps/s for 30 agents on one CPU. SPEC goal: >= 5 M on"
            " 2 cores for 30+ agents.",
            "agent_steps_per_s: the whole CLI run (wall_time_s covers start-up, JIT"
            " compilation, training and the greedy evaluation of every agent; score 1.0 = the"
            " goal reached), from an empty compilation cache. cached_*: the same run again with"
            " the programs the first one cached (backend.compilation_cache), as a user's next"
            " run of it. compiled_agent_steps_per_s: the same program once compiled, in the"
            " CLI's chunks of log_every env steps with their episode statistics fetched.",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-qlearn-") as tmp:
        for agents, steps in QUICK if quick else FULL:
            overrides = [
                "algo=qlearn",
                "task=gridworld",
                "backend=flax",
                "env=jax-vmap",
                "num_envs=1",
                f"num_seeds={agents}",
                f"total_steps={steps}",
                f"log_every={steps // 4}",
                f"eval_every={steps}",
            ]
            table.configs.append("rlspeed " + " ".join(overrides))
            cache = f"backend.compilation_cache={tmp}/xla-{agents}"  # empty for each row
            metrics = run_rlspeed([*overrides, cache], Path(tmp) / f"agents{agents}")
            cached = run_rlspeed([*overrides, cache], Path(tmp) / f"agents{agents}_cached")
            table.add(
                agents=agents,
                envs_per_agent=1,
                agent_steps=metrics["env_steps"],
                wall_time_s=metrics["wall_time_s"],
                agent_steps_per_s=metrics["env_steps_per_s"],
                updates_per_s=metrics["updates_per_s"],
                mean_score=metrics["score"],
                cached_wall_time_s=cached["wall_time_s"],
                cached_agent_steps_per_s=cached["env_steps_per_s"],
                compiled_agent_steps_per_s=compiled_env_steps_per_s(
                    [*overrides, cache], 0.2 if quick else 3.0
                ),
            )
    return write_results(table, out_dir, _plot)


def _plot(table: Table, ax: Any) -> None:
    agents = [r["agents"] for r in table.rows]
    ax.plot(
        agents, [r["agent_steps_per_s"] for r in table.rows], marker="o", label="rlspeed, whole run"
    )
    ax.plot(
        agents,
        [r["cached_agent_steps_per_s"] for r in table.rows],
        marker="^",
        label="rlspeed, whole run, compiled programs cached",
    )
    ax.plot(
        agents,
        [r["compiled_agent_steps_per_s"] for r in table.rows],
        marker="s",
        label="rlspeed, compiled program",
    )
    ax.axhline(5e6, color="tab:green", linestyle=":", label="SPEC goal (30+ agents)")
    ax.axhline(1.47e6, color="gray", linestyle="--", label="seed 002, 30 agents")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(agents, [str(a) for a in agents])
    ax.minorticks_off()
    ax.set_xlabel("agents in one program")
    ax.set_ylabel("agent-steps / s")
    ax.legend()
