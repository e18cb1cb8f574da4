"""What every benchmark shares: the machine stamp, running the real CLI, and writing the
results as CSV, a markdown table and a PNG next to each other."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

LIBRARIES = (
    "rlspeed", "jax", "jaxlib", "flax", "optax", "torch", "gymnasium", "numpy", "mujoco",
    "mujoco-mjx",
)  # fmt: skip


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return ", ".join(names) if out.returncode == 0 and names else None


def machine_stamp() -> dict[str, Any]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu_name() or "none",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


@dataclass
class Table:
    """One benchmark's results: rows of named columns, with how each was produced."""

    name: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    # What the reader must know to reproduce it: the command lines or settings per row.
    configs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, **row: Any) -> None:
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise ValueError(f"row of {self.name} lacks {missing}")
        self.rows.append(row)
        print("  " + "  ".join(f"{c}={_fmt(row[c])}" for c in self.columns), flush=True)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN: a cell that was not measured
            return "–"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value)


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


def write_results(table: Table, out_dir: Path, plot: Callable[[Table, Any], None]) -> list[Path]:
    """``<name>.csv``, ``<name>.md`` and ``<name>.png`` in ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = machine_stamp()
    csv_path = out_dir / f"{table.name}.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=table.columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table.rows)

    png_path = out_dir / f"{table.name}.png"
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    plot(table, ax)
    ax.set_title(
        f"{table.title}\n{stamp['cpu']} ({stamp['cores']} cores), GPU: {stamp['gpu']}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)

    md_path = out_dir / f"{table.name}.md"
    lines = [f"# {table.title}", "", f"![{table.name}]({png_path.name})", ""]
    lines.append("| " + " | ".join(table.columns) + " |")
    lines.append("|" + "---|" * len(table.columns))
    for row in table.rows:
        lines.append("| " + " | ".join(_fmt(row[c]) for c in table.columns) + " |")
    if table.notes:
        lines += ["", *[f"- {note}" for note in table.notes]]
    lines += [
        "",
        "## Machine",
        "",
        f"- CPU: {stamp['cpu']}, {stamp['cores']} cores",
        f"- GPU: {stamp['gpu']}",
        f"- Python {stamp['python']} on {stamp['platform']}",
        "- " + ", ".join(f"{k} {v}" for k, v in stamp["versions"].items()),
        f"- measured {stamp['date']}",
    ]
    if table.configs:
        lines += ["", "## Configs", "", "```", *table.configs, "```"]
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, md_path, png_path]


def run_module(module: str, args: Sequence[str]) -> str:
    """``python -m module *args`` in a fresh process (no shared JIT caches or torch threads
    between the runs compared); its stdout, or a RuntimeError with the output's tail."""
    result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{module} {' '.join(args)} failed: " + " | ".join(tail))
    return result.stdout


def run_rlspeed(overrides: Sequence[str], run_dir: Path) -> dict[str, Any]:
    """Train through the real CLI in a fresh process and return its ``metrics.json``."""
    run_module(
        "rlspeed.cli",
        [*overrides, "tracking=none", "progress=none", f"hydra.run.dir={run_dir}"],
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["config"] = yaml.safe_load((run_dir / "config.yaml").read_text())
    return metrics
