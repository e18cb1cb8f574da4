"""``gpu``: what one accelerator changes, in one command that ends within 8 minutes there.

Three tables, each CSV, markdown and PNG:

- ``gpu_envs``: env steps/s against ``num_envs`` (Doors and CartPole, random actions), the
  Gymnasium vector env stepped from Python against the fused ``jax-vmap`` step, up to
  widths only an accelerator holds;
- ``gpu_dqn_doors``: DQN on Doors through the real CLI, torch + gym-sync against
  flax + jax-vmap, at equal env steps and gradient updates;
- ``gpu_ppo_seeds``: PPO on CartPole fused, one seed against 16 seeds in one program.

JAX and torch both run on the accelerator they find (``backend.device=auto``); the
Gymnasium envs of ``gym-sync`` step on the CPU.

    rlspeed-bench gpu --out docs/benchmarks/gpu
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, run_rlspeed, write_results
from rlspeed.bench.envs import COLUMNS, rates_table
from rlspeed.bench.stacks import compare_stacks

# Gymnasium's vector env costs the same per env at any width: past this it only takes time.
GYM_MAX_ENVS = 1024
# The PPO CartPole config whose many-seed cost issue 24 measured (CleanRL's ppo.py settings).
PPO_CARTPOLE = [
    "algo=ppo", "task=cartpole", "backend=flax", "env=jax-vmap", "seed=1", "num_envs=4",
    "algo.num_steps=128", "algo.update_epochs=4", "algo.num_minibatches=4",
    "algo.learning_rate=0.00025", "algo.anneal_lr=true", "algo.ent_coef=0.01",
    "algo.gae_lambda=0.95", "algo.gamma=0.99", "algo.hidden_sizes=[64,64]",
    "total_steps=499712", "log_every=49152", "eval_every=499712",
]  # fmt: skip
PPO_COLUMNS = [
    "num_seeds", "env_steps", "gradient_updates", "wall_time_s", "env_steps_per_s",
    "updates_per_s", "score", "x_one_seed",
]  # fmt: skip
PPO_QUICK = ["total_steps=2048", "log_every=1024", "eval_every=2048", "task.eval_episodes=2"]


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    return [
        *_envs(out_dir, quick, compose),
        *_dqn_doors(out_dir, quick),
        *_ppo_seeds(out_dir, quick),
    ]


def _envs(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    env_counts = (1, 8) if quick else (1, 64, 1024, 16384, 131072)
    budget_s = 0.05 if quick else 1.0
    table = Table(
        "gpu_envs",
        "Environment steps/s against num_envs: Gymnasium against the fused JAX step",
        COLUMNS,
        notes=[
            f"gym-sync stops at {GYM_MAX_ENVS} envs: its cost grows with every env.",
            "jax-fused: the vmapped step inside one jitted lax.scan (compile time excluded).",
            "x_gym_sync: divided by gym-sync's rate at the widest num_envs it ran up to this one.",
            f"Each figure: at least {budget_s} s of stepping after one warm-up call.",
        ],
    )
    modes = ("gym-sync", "jax-fused")
    rates_table(table, compose, modes, env_counts, budget_s, {"gym-sync": GYM_MAX_ENVS})
    return write_results(table, out_dir, _plot_envs)


def _dqn_doors(out_dir: Path, quick: bool) -> list[Path]:
    overrides = ["algo=dqn", "task=doors", "seed=1", "total_steps=102400"]
    if quick:
        overrides += ["total_steps=3072", "algo.learning_starts=1024", "eval_every=3072"]
    return compare_stacks(
        "gpu_dqn_doors",
        "DQN on Doors (15x15): torch + gym-sync against flax + jax-vmap at equal work",
        overrides,
        out_dir,
        [
            "backend.device=auto: torch's networks and updates and flax + jax-vmap's whole"
            " program on the accelerator; gym-sync's envs on the CPU.",
            "Seed's Table 2 (GPU): 22.5 min torch + gym-sync, 2.3 min flax + jax-vmap,"
            " at 3x these env steps.",
        ],
        baseline_env_id=None,
        budget_s=0.2 if quick else 3.0,
        stacks=(("torch", "gym-sync"), ("flax", "jax-vmap")),
    )


def _ppo_seeds(out_dir: Path, quick: bool) -> list[Path]:
    table = Table(
        "gpu_ppo_seeds",
        "PPO on CartPole, flax + jax-vmap: one seed against 16 seeds in one program",
        PPO_COLUMNS,
        notes=[
            "Whole runs through the CLI (start-up, compilation, evaluation included),"
            " tracking=none; env_steps and gradient_updates count every seed.",
            "x_one_seed: env steps/s divided by the one-seed run's: what the extra seeds cost.",
        ],
    )
    overrides = [*PPO_CARTPOLE, *(PPO_QUICK if quick else [])]
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-gpu-") as tmp:
        for num_seeds in (1, 16):
            args = [*overrides, f"num_seeds={num_seeds}"]
            table.configs.append("rlspeed " + " ".join(args))
            metrics = run_rlspeed(args, Path(tmp) / f"seeds{num_seeds}")
            one = table.rows[0]["env_steps_per_s"] if table.rows else metrics["env_steps_per_s"]
            table.add(
                num_seeds=num_seeds,
                env_steps=metrics["env_steps"],
                gradient_updates=metrics["gradient_updates"],
                wall_time_s=metrics["wall_time_s"],
                env_steps_per_s=metrics["env_steps_per_s"],
                updates_per_s=metrics["updates_per_s"],
                score=metrics["score"],
                x_one_seed=metrics["env_steps_per_s"] / one,
            )
    return write_results(table, out_dir, _plot_seeds)


def _plot_envs(table: Table, ax: Any) -> None:
    for color, task_name in enumerate(("doors", "cartpole")):
        for style, mode in (("-", "jax-fused"), ("--", "gym-sync")):
            rows = [r for r in table.rows if r["task"] == task_name and r["mode"] == mode]
            ax.plot(
                [r["num_envs"] for r in rows],
                [r["env_steps_per_s"] for r in rows],
                style,
                color=f"C{color}",
                marker="o",
                label=f"{task_name} {mode}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("num_envs")
    ax.set_ylabel("env steps / s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _plot_seeds(table: Table, ax: Any) -> None:
    labels = [f"{r['num_seeds']} seed{'s' if r['num_seeds'] > 1 else ''}" for r in table.rows]
    bars = ax.bar(labels, [r["env_steps_per_s"] for r in table.rows], color="tab:blue")
    for bar, row in zip(bars, table.rows, strict=True):
        ax.annotate(
            f"{row['wall_time_s']:.1f} s",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("env steps / s over all seeds (whole run)")
    ax.margins(y=0.2)
