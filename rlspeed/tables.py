"""Results as CSV, a markdown table and a PNG next to each other, stamped with the machine
and library versions that produced them: what every benchmark writes (``rlspeed.bench``) and
a multirun's comparison of its jobs (``rlspeed.comparison``)."""

from __future__ import annotations

import csv
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rlspeed.tracking._environment import cpu_model, gpu_names

LIBRARIES = (
    "rlspeed", "jax", "jaxlib", "flax", "optax", "torch", "gymnasium", "numpy", "mujoco",
    "mujoco-mjx",
)  # fmt: skip


def machine_stamp() -> dict[str, Any]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "cpu": cpu_model() or platform.machine(),
        "cores": os.cpu_count(),
        "gpu": ", ".join(gpu_names()) or "none",
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
