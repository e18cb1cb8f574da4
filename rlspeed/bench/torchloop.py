"""``torchloop``: rlspeed's torch + gym-sync DQN against the plain script doing the same
work, on CartPole and Doors, with one thread and with every core.

Whole processes as users run them (tracking on), interleaved, medians of ``repeats``
rounds after one warm-up run that creates the MLflow store; the script
(``rlspeed.bench.cleanrl_dqn``) takes the rlspeed run's resolved hyperparameters and
uses torch's default threads (one per core). ``backend.threads=auto`` is judged by these
rows: the variant it picks is marked.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, write_results
from rlspeed.bench.overhead import COLUMNS, interleaved, plot_process_times, timed_rlspeed
from rlspeed.bench.stacks import cleanrl_baseline_args, run_cleanrl_baseline
from rlspeed.validation import auto_threads

# task -> the Gymnasium id the script trains on.
TASKS = {"cartpole": "CartPole-v1", "doors": "rlspeed/Doors-v0"}
SCRIPT = "cleanrl_dqn.py"


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    repeats = 1 if quick else 3
    # quick: 3,000 steps past DQN's learning_starts (5,000), so every variant updates.
    steps = 8_000 if quick else 100_000
    table = Table(
        "torchloop",
        f"torch + gym-sync DQN against a plain script, {steps:,} env steps, 1 and 2 threads",
        COLUMNS,
        notes=[
            "process_s: the whole process, start to exit, median of"
            f" {repeats} interleaved rounds after one warm-up run (which created the default"
            " MLflow store); rlspeed runs with tracking on (tracking=mlflow, its default).",
            "ratio: median over rounds of this variant's process_s over the script's.",
            f"{SCRIPT}: rlspeed/bench/cleanrl_dqn.py with the rlspeed run's resolved"
            " hyperparameters and torch's default threads (one per core); no evaluation or"
            " tracking in the script.",
            "(auto): the variant backend.threads=auto picks for this task.",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-torchloop-") as tmp:
        folder = Path(tmp)
        for task, env_id in TASKS.items():
            overrides = ["backend=torch", "env=gym-sync", "algo=dqn", f"task={task}"]
            overrides.append(f"total_steps={steps}")
            picked = auto_threads(compose(overrides))
            variants: dict[str, Callable[[int], dict[str, Any]]] = {}
            for threads in (1, 0):
                name = f"rlspeed threads={threads or 'all cores'}"
                command = [*overrides, f"backend.threads={threads}"]
                table.configs.append("rlspeed " + " ".join(command))
                runs = folder / f"{task}-threads{threads}"

                def go(repeat: int, command: list[str] = command, runs: Path = runs) -> Any:
                    return timed_rlspeed(command, folder, runs / str(repeat))

                variants[name + (" (auto)" if threads == picked else "")] = go
            config = next(iter(variants.values()))(-1)["config"]  # warm-up

            def script(_: int, env_id: str = env_id, config: Any = config) -> dict[str, Any]:
                start = time.perf_counter()
                metrics = run_cleanrl_baseline(config, env_id)
                metrics["process_s"] = time.perf_counter() - start
                return metrics

            variants[SCRIPT] = script
            interleaved(table, f"torch-dqn-{task}", variants, repeats)
            args = cleanrl_baseline_args(config, env_id)
            table.configs.append("python -m rlspeed.bench.cleanrl_dqn " + " ".join(args))
    return write_results(table, out_dir, plot_process_times)
