"""One training config run on several (backend, engine) stacks through the real CLI, each
in a fresh process, compared against the first stack at equal env steps."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, run_rlspeed, write_results

# The seed's Table 2 columns, torch + gym-sync (the baseline) first.
STACKS = (("torch", "gym-sync"), ("flax", "gym-sync"), ("torch", "jax-vmap"), ("flax", "jax-vmap"))
COLUMNS = [
    "backend",
    "engine",
    "num_envs",
    "env_steps",
    "gradient_updates",
    "score",
    "rolling_step_reward",
    "recent_return",
    "wall_time_s",
    "env_steps_per_s",
    "updates_per_s",
    "speedup",
]


def compare_stacks(
    name: str, title: str, overrides: list[str], out_dir: Path, notes: list[str]
) -> list[Path]:
    """Train ``overrides`` on every stack of ``STACKS``; ``speedup`` is wall time relative
    to the first stack (equal env steps and gradient updates, so equal work)."""
    table = Table(
        name,
        title,
        COLUMNS,
        notes=[
            "Every stack trains the same config for the same env steps and gradient updates;"
            " wall time includes start-up, JIT compilation and evaluation.",
            "speedup: wall time of torch + gym-sync divided by this stack's.",
            *notes,
        ],
    )
    with tempfile.TemporaryDirectory(prefix=f"rlspeed-bench-{name}-") as tmp:
        for backend, engine in STACKS:
            stack = [f"backend={backend}", f"env={engine}", *overrides]
            table.configs.append("rlspeed " + " ".join(stack))
            metrics = run_rlspeed(stack, Path(tmp) / f"{backend}_{engine}")
            baseline = table.rows[0]["wall_time_s"] if table.rows else metrics["wall_time_s"]
            table.add(
                backend=backend,
                engine=engine,
                num_envs=metrics["config"]["num_envs"],
                env_steps=metrics["env_steps"],
                gradient_updates=metrics["gradient_updates"],
                score=metrics["score"],
                rolling_step_reward=metrics["rolling_step_reward"],
                recent_return=metrics["recent_return"],
                wall_time_s=metrics["wall_time_s"],
                env_steps_per_s=metrics["env_steps_per_s"],
                updates_per_s=metrics["updates_per_s"],
                speedup=baseline / metrics["wall_time_s"],
            )
    return write_results(table, out_dir, _plot)


def _plot(table: Table, ax: Any) -> None:
    labels = [f"{r['backend']}\n{r['engine']}" for r in table.rows]
    bars = ax.bar(labels, [r["env_steps_per_s"] for r in table.rows], color="tab:blue")
    for bar, row in zip(bars, table.rows, strict=True):
        ax.annotate(
            f"{row['speedup']:.1f}x\nscore {row['score']:.3g}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_yscale("log")
    ax.set_ylabel("env steps / s (whole training run)")
    ax.margins(y=0.3)
