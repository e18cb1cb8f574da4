"""``overhead``: what surrounds the compiled program, in whole processes as users run them.

Each row times the ``rlspeed`` command from process start to exit, in interleaved pairs
(default ``tracking=mlflow`` against ``tracking=none``), after one warm-up run that fills
the compilation cache and creates the MLflow store, as a user's next run finds them.
Medians of ``repeats`` pairs; env steps/s and updates/s come with every time, so no ratio
comes from less work. ``torchloop`` runs the torch loop the same way.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlspeed.bench.common import Table, write_results
from rlspeed.bench.purejaxrl import RLSPEED_OVERRIDES as DQN_CARTPOLE_FUSED

# PPO on CartPole at CleanRL's ppo.py settings (the config), 976 iterations.
PPO_CARTPOLE_FUSED = [
    "backend=flax",
    "env=jax-vmap",
    "algo=ppo",
    "task=cartpole",
    "num_envs=4",
    "algo.num_steps=128",
    "algo.update_epochs=4",
    "algo.num_minibatches=4",
    "algo.learning_rate=0.00025",
    "algo.anneal_lr=true",
    "algo.ent_coef=0.01",
    "algo.gae_lambda=0.95",
    "algo.gamma=0.99",
    "algo.hidden_sizes=[64,64]",
]

COLUMNS = [
    "case",
    "variant",
    "runs",
    "process_s",
    "ratio",
    "env_steps",
    "gradient_updates",
    "env_steps_per_s",
    "updates_per_s",
    "outside_compiled_s",
    "outside_fraction",
]


def timed_rlspeed(overrides: list[str], cwd: Path, run_dir: Path) -> dict[str, Any]:
    """The ``rlspeed`` command in a fresh process in ``cwd``: its ``metrics.json`` with
    ``process_s``, the time from process start to exit."""
    command = [sys.executable, "-m", "rlspeed.cli", *overrides, "progress=none"]
    start = time.perf_counter()
    result = subprocess.run(
        [*command, f"hydra.run.dir={run_dir}"], cwd=cwd, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"rlspeed {' '.join(overrides)} failed: {result.stderr[-500:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["process_s"] = seconds
    metrics["config"] = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    return metrics


def median_row(
    table: Table, case: str, variant: str, runs: list[dict[str, Any]], ratio: float
) -> None:
    seconds = statistics.median(run["process_s"] for run in runs)
    steps, updates = runs[0]["env_steps"], runs[0]["gradient_updates"]
    compiled = [run.get("compiled_calls_s") for run in runs]
    outside = (
        statistics.median(r["process_s"] - c for r, c in zip(runs, compiled, strict=True))
        if all(c is not None for c in compiled)
        else float("nan")
    )
    table.add(
        case=case,
        variant=variant,
        runs=len(runs),
        process_s=seconds,
        ratio=ratio,
        env_steps=steps,
        gradient_updates=updates,
        env_steps_per_s=steps / seconds,
        updates_per_s=updates / seconds,
        outside_compiled_s=outside,
        outside_fraction=outside / seconds,
    )


def interleaved(
    table: Table,
    case: str,
    variants: dict[str, Callable[[int], dict[str, Any]]],
    repeats: int,
) -> None:
    """Run the variants interleaved ``repeats`` times; one median row each, ``ratio`` =
    each variant's time over the last variant's (the reference), pair by pair."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for repeat in range(repeats):
        for name, run in variants.items():
            runs[name].append(run(repeat))
    reference = list(variants)[-1]
    for name, results in runs.items():
        ratios = [
            a["process_s"] / b["process_s"] for a, b in zip(results, runs[reference], strict=True)
        ]
        median_row(table, case, name, results, statistics.median(ratios))


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    repeats = 1 if quick else 3
    table = Table(
        "overhead",
        "Whole processes as users run them: tracking and many seeds on the fused path",
        COLUMNS,
        notes=[
            "process_s: the rlspeed command from process start to exit (imports, config"
            " checks, compilation or cache loading, training, evaluation, outputs), median of"
            f" {repeats} interleaved runs after one warm-up run that filled the compilation"
            " cache and created the default MLflow store (sqlite:///mlflow.db).",
            "ratio: median over pairs of this variant's process_s over the case's last"
            " variant's, run right after it.",
            "outside_compiled_s: process_s minus the time in the compiled chunk calls"
            " (metrics.json compiled_calls_s; the first call loads the cached program);"
            " outside_fraction: its share of process_s.",
        ],
    )
    # quick: 40 of PPO's batches of 4 envs x 128 steps; DQN 10,000 steps past its
    # learning_starts (10,000), 1,000 updates.
    ppo_steps = "total_steps=20480" if quick else "total_steps=499712"
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-overhead-") as tmp:
        folder = Path(tmp)
        cache = f"backend.compilation_cache={folder}/xla"

        def rlspeed_variant(overrides: list[str]) -> Callable[[int], dict[str, Any]]:
            table.configs.append("rlspeed " + " ".join(overrides))
            label = len(table.configs)

            def go(repeat: int) -> dict[str, Any]:
                return timed_rlspeed(overrides, folder, folder / f"run{label}-{repeat}")

            return go

        cases = {
            "ppo-cartpole-fused": [*PPO_CARTPOLE_FUSED, ppo_steps, cache],
            "dqn-cartpole-fused": [*DQN_CARTPOLE_FUSED, cache]
            + (["total_steps=20000"] if quick else []),
            "ppo-cartpole-fused-16-seeds": [*PPO_CARTPOLE_FUSED, ppo_steps, cache, "num_seeds=16"],
        }
        for case, overrides in cases.items():
            tracked = rlspeed_variant([*overrides, "tracking=mlflow"])
            untracked = rlspeed_variant([*overrides, "tracking=none"])
            tracked(-1)  # warm-up: compiles and caches the program, creates the store
            variants = {"tracking=mlflow": tracked, "tracking=none": untracked}
            interleaved(table, case, variants, repeats)
    return write_results(table, out_dir, plot_process_times)


def plot_process_times(table: Table, ax: Any) -> None:
    """Each row's whole process, and the part outside the compiled calls where known."""
    labels = [f"{row['case']}\n{row['variant']}" for row in table.rows]
    seconds = [row["process_s"] for row in table.rows]
    outside = [row["outside_compiled_s"] for row in table.rows]
    positions = range(len(labels))
    ax.barh(positions, seconds, color="tab:blue", label="whole process")
    ax.barh(positions, outside, color="tab:orange", label="outside the compiled calls")
    ax.set_yticks(list(positions), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median)")
    ax.legend(fontsize=8)
