"""One training config run on several (backend, engine) stacks through the real CLI, each
in a fresh process, compared against the first stack at equal env steps."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, run_module, run_rlspeed, write_results
from rlspeed.bench.compiled import compiled_env_steps_per_s

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
    "compiled_env_steps_per_s",
    "speedup",
]


# The DQN hyperparameters the CleanRL-style script takes, by their rlspeed names.
BASELINE_ALGO_KEYS = (
    "learning_rate",
    "anneal_lr",
    "buffer_size",
    "gamma",
    "tau",
    "target_network_frequency",
    "batch_size",
    "start_e",
    "end_e",
    "exploration_fraction",
    "learning_starts",
    "train_frequency",
    "hidden_sizes",
)


def cleanrl_baseline_args(config: dict[str, Any], env_id: str) -> list[str]:
    """The arguments of ``rlspeed.bench.cleanrl_dqn`` that train with the hyperparameters
    of the resolved rlspeed ``config`` (a DQN run) on ``env_id``."""
    args = [f"--env-id={env_id}", f"--seed={config['seed']}", f"--num-envs={config['num_envs']}"]
    args.append(f"--total-steps={config['total_steps']}")
    for key in BASELINE_ALGO_KEYS:
        flag, value = "--" + key.replace("_", "-"), config["algo"][key]
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            args += [flag, *map(str, value)]
        else:
            args.append(f"{flag}={value}")
    return args


def run_cleanrl_baseline(config: dict[str, Any], env_id: str) -> dict[str, Any]:
    """Run ``rlspeed.bench.cleanrl_dqn`` in a fresh process with the hyperparameters of
    the resolved rlspeed ``config`` (a DQN run) and return its final JSON line."""
    args = cleanrl_baseline_args(config, env_id)
    stdout = run_module("rlspeed.bench.cleanrl_dqn", args)
    metrics = json.loads(stdout.strip().splitlines()[-1])
    metrics["command"] = "python -m rlspeed.bench.cleanrl_dqn " + " ".join(args)
    return metrics


def compare_stacks(
    name: str,
    title: str,
    overrides: list[str],
    out_dir: Path,
    notes: list[str],
    baseline_env_id: str | None,
    budget_s: float,
    stacks: Sequence[tuple[str, str]] = STACKS,
) -> list[Path]:
    """Train ``overrides`` on every one of ``stacks``; ``speedup`` is wall time relative
    to the first stack (equal env steps and gradient updates, so equal work). After the
    first stack, the CleanRL-style script (``rlspeed.bench.cleanrl_dqn``) trains with its
    resolved hyperparameters on ``baseline_env_id``, so the PyTorch path is checked against
    a plain script (None: no script)."""
    table = Table(
        name,
        title,
        COLUMNS,
        notes=[
            "Every stack trains the same config for the same env steps and gradient updates;"
            " wall time includes start-up, JIT compilation and evaluation.",
            "Every stack starts with an empty compilation cache (backend.compilation_cache);"
            " jax-vmap (cached) runs flax + jax-vmap again with the programs its first run"
            " cached, as a user's next run of the same config does (no compiling).",
            "speedup: wall time of torch + gym-sync divided by this stack's.",
            "compiled_env_steps_per_s (flax + jax-vmap): the same training program once"
            " compiled, timed after learning_starts in the CLI's chunks of log_every env steps"
            " (no start-up, compilation or evaluation).",
            *notes,
        ],
    )
    if baseline_env_id is not None:
        table.notes.append(
            "cleanrl-script: a single-file CleanRL-style DQN (rlspeed/bench/cleanrl_dqn.py)"
            " with torch + gym-sync's hyperparameters; it times env creation to the last update,"
            " with no evaluation or tracking, and has no greedy score."
        )
    with tempfile.TemporaryDirectory(prefix=f"rlspeed-bench-{name}-") as tmp:
        # Every stack starts from an empty compilation cache of its own; the last run
        # repeats flax + jax-vmap with the programs its first run cached, as a user's next
        # run would.
        runs = [(backend, engine, engine) for backend, engine in stacks]
        runs.append(("flax", "jax-vmap", "jax-vmap (cached)"))
        for index, (backend, engine, label) in enumerate(runs):
            stack = [f"backend={backend}", f"env={engine}", *overrides]
            cache = f"backend.compilation_cache={tmp}/xla-{backend}-{engine}"
            table.configs.append("rlspeed " + " ".join(stack))
            metrics = run_rlspeed([*stack, cache], Path(tmp) / f"run{index}")
            baseline = table.rows[0]["wall_time_s"] if table.rows else metrics["wall_time_s"]
            table.add(
                backend=backend,
                engine=label,
                num_envs=metrics["config"]["num_envs"],
                env_steps=metrics["env_steps"],
                gradient_updates=metrics["gradient_updates"],
                score=metrics["score"],
                rolling_step_reward=metrics["rolling_step_reward"],
                recent_return=metrics["recent_return"],
                wall_time_s=metrics["wall_time_s"],
                env_steps_per_s=metrics["env_steps_per_s"],
                updates_per_s=metrics["updates_per_s"],
                compiled_env_steps_per_s=(
                    compiled_env_steps_per_s([*stack, cache], budget_s)
                    if (backend, label) == ("flax", "jax-vmap")
                    else float("nan")
                ),
                speedup=baseline / metrics["wall_time_s"],
            )
            if len(table.rows) == 1 and baseline_env_id is not None:
                script = run_cleanrl_baseline(metrics["config"], baseline_env_id)
                table.configs.append(script["command"])
                table.add(
                    **{key: script[key] for key in COLUMNS if key in script},
                    backend="cleanrl-script",
                    engine="gym-sync",
                    num_envs=metrics["config"]["num_envs"],
                    score=float("nan"),
                    rolling_step_reward=float("nan"),
                    compiled_env_steps_per_s=float("nan"),
                    speedup=baseline / script["wall_time_s"],
                )
    return write_results(table, out_dir, _plot)


def _plot(table: Table, ax: Any) -> None:
    labels = [f"{r['backend']}\n{r['engine']}" for r in table.rows]
    bars = ax.bar(labels, [r["env_steps_per_s"] for r in table.rows], color="tab:blue")
    for bar, row in zip(bars, table.rows, strict=True):
        ax.annotate(
            f"{row['speedup']:.1f}x\n" + _learning_label(row),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_yscale("log")
    ax.set_ylabel("env steps / s (whole training run)")
    ax.margins(y=0.3)


def _learning_label(row: dict[str, Any]) -> str:
    # The CleanRL-style script has no greedy evaluation; it shows its last-20 return.
    if row["score"] == row["score"]:
        return f"score {row['score']:.3g}"
    return f"return {row['recent_return']:.3g}"
