"""What every benchmark shares: timing calls, running the real CLI, and (from
``rlspeed.tables``) the machine stamp and writing the results as CSV, a markdown table and a
PNG next to each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

# Re-exported: each benchmark writes its table with them.
from rlspeed.tables import Table, write_results

__all__ = [
    "Table", "calls_per_second", "paired_bars", "run_module", "run_rlspeed", "write_results",
]  # fmt: skip


def calls_per_second(call: Callable[[], Any], budget_s: float, warm_up_calls: int = 1) -> float:
    """How many times per second ``call()`` runs (it must wait for its own work), timed
    over at least ``budget_s`` and two calls, after ``warm_up_calls`` (compilation)."""
    for _ in range(warm_up_calls):
        call()
    calls, start = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and calls >= 2:
            return calls / elapsed


def run_module(module: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """``python -m module *args`` in a fresh process (no shared JIT caches or torch threads
    between the runs compared), with ``env`` added to its environment; its stdout, or a
    RuntimeError with the output's tail."""
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{module} {' '.join(args)} failed: " + " | ".join(tail))
    return result.stdout


def run_rlspeed(
    overrides: Sequence[str], run_dir: Path, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Train through the real CLI in a fresh process (``env`` added to its environment)
    and return its ``metrics.json``."""
    run_module(
        "rlspeed.cli",
        [*overrides, "tracking=none", "progress=none", f"hydra.run.dir={run_dir}"],
        env,
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["config"] = yaml.safe_load((run_dir / "config.yaml").read_text())
    return metrics


def paired_bars(
    ax: Any, labels: list[str], left: tuple[str, list[float]], right: tuple[str, list[float]]
) -> range:
    """Two bars per label, side by side: ``left`` and ``right`` as (legend, heights).
    Returns the labels' positions on the x axis."""
    positions = range(len(labels))
    width = 0.4
    for offset, (legend, heights) in ((-width / 2, left), (width / 2, right)):
        ax.bar([p + offset for p in positions], heights, width, label=legend)
    ax.set_xticks(list(positions), labels)
    return positions
