"""``qlearn``: aggregate agent-steps/s of tabular Q-learning agents trained in one program
(``num_seeds`` agents vmapped on the fused path), as in seed 002's 30 agents on a GridWorld.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jax

from rlspeed.algos.qlearn.flax import make_train
from rlspeed.bench.common import Table, calls_per_second, run_rlspeed, write_results
from rlspeed.engines.jax_vmap import make_vmap_env
from rlspeed.registry import TASKS

# (agents, env steps per agent) with one env per agent, as the seed ran them.
FULL = ((1, 2_000_000), (30, 1_000_000), (1024, 65_536))
QUICK = ((1, 20_000), (30, 20_000), (1024, 2_048))


def steady_rate(agents: int, overrides: list[str], compose: Any, budget_s: float) -> float:
    """Agent-steps/s of the same vmapped program once compiled: chunks of 512 iterations,
    timed after a warm-up chunk (what the whole-run figure pays on top is start-up,
    compilation and evaluating every agent)."""
    cfg = compose(overrides)
    env = make_vmap_env(TASKS.get(cfg.task.name), cfg.task, cfg.num_envs)
    trainer = make_train(cfg, env)
    iterations = 512
    run_chunk = jax.jit(jax.vmap(lambda state: trainer.run(state, iterations)[0]))
    state = jax.jit(jax.vmap(trainer.init))(jax.random.split(jax.random.key(cfg.seed), agents))
    states = [state]

    def chunk() -> None:
        states[0] = jax.block_until_ready(run_chunk(states[0]))

    chunks_per_s = calls_per_second(chunk, budget_s)
    return chunks_per_s * iterations * trainer.steps_per_iteration * agents


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
            "compiled_agent_steps_per_s",
        ],
        notes=[
            "Seed 002: 1.47 M agent-steps/s for 30 agents on one CPU. SPEC goal: >= 5 M on"
            " 2 cores for 30+ agents.",
            "agent_steps_per_s: the whole CLI run (wall_time_s covers start-up, JIT"
            " compilation, training and the greedy evaluation of every agent; score 1.0 = the"
            " goal reached). compiled_agent_steps_per_s: the same program once compiled.",
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
            metrics = run_rlspeed(overrides, Path(tmp) / f"agents{agents}")
            table.add(
                agents=agents,
                envs_per_agent=1,
                agent_steps=metrics["env_steps"],
                wall_time_s=metrics["wall_time_s"],
                agent_steps_per_s=metrics["env_steps_per_s"],
                updates_per_s=metrics["updates_per_s"],
                mean_score=metrics["score"],
                compiled_agent_steps_per_s=steady_rate(
                    agents, overrides, compose, 0.2 if quick else 3.0
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
