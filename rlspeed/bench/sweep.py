"""``sweep``: whole Optuna sweeps as users run them, one trial per program against batches
of trials trained as one program (``hydra.sweeper.batch_size``).

Each row is one ``rlspeed -m hparams=...`` process, from start to exit, in a fresh folder:
its own study journal, the default MLflow store (``tracking=mlflow``) and an empty
compilation cache, as a user's first sweep finds them. The sampler is seeded, so the
batch-size-1 sweep asks for the same first trials each time; batches ask for several
trials before any has finished (TPE's constant liar), so later trials differ. Env steps and
updates of all trials are reported with the time, and for batched sweeps a lone run of one
of their completed trials checks that its lane learned what the run does alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from rlspeed.bench.common import Table, write_results

CASES = {
    "qlearn_search": ["hparams=qlearn_search", "backend=flax", "env=jax-vmap"],
    "ppo_float_search": ["hparams=ppo_float_search", "backend=flax", "env=jax-vmap"],
}
# quick: fewer and shorter trials (a batch of 4 is one program).
QUICK = {
    "qlearn_search": ["hydra.sweeper.n_trials=4", "total_steps=64000"],
    "ppo_float_search": ["hydra.sweeper.n_trials=4", "total_steps=20480"],
}
COLUMNS = [
    "search",
    "batch_size",
    "process_s",
    "ratio",
    "trials",
    "complete",
    "pruned",
    "trials_per_hour",
    "best_value",
    "env_steps",
    "gradient_updates",
    "env_steps_per_s",
    "updates_per_s",
    "lane_vs_lone_first",
    "lane_vs_lone",
]


def sweep_process(overrides: list[str], folder: Path) -> dict[str, Any]:
    """One sweep in a fresh process in ``folder``: its time, and every trial's folder,
    config overrides and metrics."""
    folder.mkdir(parents=True)
    command = [sys.executable, "-m", "rlspeed.cli", "-m", *overrides, "progress=none"]
    command.append(f"backend.compilation_cache={folder / 'xla'}")
    start = time.perf_counter()
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"rlspeed -m {' '.join(overrides)} failed: {result.stderr[-800:]}")
    trials = []
    for job in sorted((folder / "outputs" / "multirun").glob("*/*/*/.hydra/..")):
        metrics_path = job / "metrics.json"
        trials.append(
            {
                "folder": job.resolve(),
                "overrides": yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()),
                "metrics": json.loads(metrics_path.read_text()) if metrics_path.exists() else None,
            }
        )
    results = yaml.safe_load(
        next((folder / "outputs" / "multirun").glob("*/*/optimization_results.yaml")).read_text()
    )
    best = {key: results.get(key) for key in ("best_value", "best_trial")}
    return {"process_s": seconds, "trials": trials, **best}


def lane_against_lone(trial: dict[str, Any], folder: Path) -> tuple[float, float]:
    """The largest difference between a batched trial's logged numbers (wall-clock rates
    aside) and those of the same config trained alone: in its first logged row, and in
    all of them with the score (a long run can drift apart from float rounding alone)."""
    config = yaml.safe_load((trial["folder"] / ".hydra" / "config.yaml").read_text())
    overrides = [o for o in trial["overrides"] if not o.startswith(("trial.", "hparams="))]
    stack = [f"algo={config['algo']['name']}", f"task={config['task']['name']}"]
    run_dir = folder / "alone"
    command = [sys.executable, "-m", "rlspeed.cli", *stack, *overrides, "tracking=none"]
    command += ["progress=none", f"hydra.run.dir={run_dir}"]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the lone run failed: {result.stderr[-800:]}")
    lone = json.loads((run_dir / "metrics.json").read_text())
    lane = trial["metrics"]
    if len(lone["history"]) != len(lane["history"]):
        return float("inf"), float("inf")
    rates = ("charts/SPS", "charts/updates_per_second")

    def largest(lone_row: dict[str, float], lane_row: dict[str, float]) -> float:
        return max(
            (abs(v - lane_row.get(k, float("inf"))) for k, v in lone_row.items() if k not in rates),
            default=0.0,
        )

    rows = list(zip(lone["history"], lane["history"], strict=True))
    worst = max([abs(lone["score"] - lane["score"])] + [largest(a, b) for a, b in rows])
    return largest(*rows[0]), worst


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    batch_sizes = [1, 4] if quick else [1, 8, 16]
    table = Table(
        "sweep",
        "Whole Optuna sweeps on the fused path: one trial per program against batches",
        COLUMNS,
        notes=[
            "process_s: the sweep command from process start to exit (tracking=mlflow, the"
            " default; a fresh study, MLflow store and compilation cache), one run per row,"
            " rows of a search run one after another. ratio: process_s over batch_size 1's.",
            "trials_per_hour: finished trials (complete, pruned or failed) per hour of"
            " process_s. best_value: the study's best score (same sampler seed; batched"
            " sweeps ask for trials before earlier ones finish, so they try other values).",
            "env_steps, gradient_updates: summed over every trial (pruned ones stop early);"
            " env_steps_per_s and updates_per_s divide them by process_s.",
            "lane_vs_lone: the largest difference between a completed batched trial's logged"
            " numbers and score and those of its config trained alone (0: identical);"
            " lane_vs_lone_first: in the first logged row only. Vmapped lanes round floats"
            " differently from a lone program, and a long PPO run can drift apart from that"
            " alone (a sampled action flips, and the episodes differ from there on).",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-sweep-") as tmp:
        for search, base in CASES.items():
            overrides = [*base, "hydra.sweeper.sampler.seed=0", *(QUICK[search] if quick else [])]
            reference = None
            for batch_size in batch_sizes:
                command = [*overrides, f"hydra.sweeper.batch_size={batch_size}"]
                table.configs.append("rlspeed -m " + " ".join(command))
                folder = Path(tmp) / f"{search}-{batch_size}"
                sweep = sweep_process(command, folder)
                reference = reference or sweep["process_s"]
                finished = [t["metrics"] for t in sweep["trials"] if t["metrics"] is not None]
                states = [m["status"] for m in finished]
                steps = sum(m["env_steps"] for m in finished)
                updates = sum(m["gradient_updates"] for m in finished)
                seconds = sweep["process_s"]
                check = (float("nan"), float("nan"))
                if batch_size > 1:
                    done = [
                        t for t in sweep["trials"]
                        if t["metrics"] and t["metrics"]["status"] == "FINISHED"
                    ]  # fmt: skip
                    check = lane_against_lone(done[len(done) // 2], folder) if done else check
                table.add(
                    search=search,
                    batch_size=batch_size,
                    process_s=seconds,
                    ratio=seconds / reference,
                    trials=len(sweep["trials"]),
                    complete=states.count("FINISHED"),
                    pruned=states.count("KILLED"),
                    trials_per_hour=len(sweep["trials"]) / seconds * 3600,
                    best_value=sweep["best_value"],
                    env_steps=steps,
                    gradient_updates=updates,
                    env_steps_per_s=steps / seconds,
                    updates_per_s=updates / seconds,
                    lane_vs_lone_first=check[0],
                    lane_vs_lone=check[1],
                )
    return write_results(table, out_dir, plot_sweeps)


def plot_sweeps(table: Table, ax: Any) -> None:
    """Each sweep's whole process time, by search and batch size."""
    labels = [f"{row['search']}\nbatch_size={row['batch_size']}" for row in table.rows]
    positions = range(len(labels))
    ax.barh(positions, [row["process_s"] for row in table.rows], color="tab:blue")
    ax.set_yticks(list(positions), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds, whole sweep process")
