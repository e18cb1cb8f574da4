"""The end of a grid of runs (``rlspeed -m backend=torch,flax env=gym-sync,jax-vmap``, Hydra's
basic sweeper): one table comparing its jobs side by side (stack, score, env steps/s,
updates/s, wall time), printed and written as ``comparison.{csv,md,png}`` in the sweep
folder. An Optuna study ends with its own table of best trials instead.

``StackComparison`` is a Hydra callback (``hydra.callbacks`` in conf/config.yaml): Hydra makes
it at every start, so this module imports nothing heavy until a multirun ends.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlspeed.tables import Table

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
COLUMNS = [
    "job", "backend", "env", "algo", "task", "overrides", "seeds", "status", "score",
    "env_steps", "env_steps_per_s", "updates_per_s", "wall_time_s",
]  # fmt: skip


class StackComparison(Callback):
    """Writes and prints the comparison of a basic-sweeper multirun's jobs at its end."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        table = comparison(sweep_dir)
        if len(table.rows) < 2:
            return  # one job: its own summary says it all
        from rlspeed.tables import write_results

        write_results(table, sweep_dir, _plot)
        _print(table, sweep_dir)


def comparison(sweep_dir: Path) -> Table:
    """A row per job folder of the sweep that holds a run's metrics, in job order."""
    import yaml

    from rlspeed.config import task_label
    from rlspeed.tables import Table

    rows = []
    for metrics_file in sweep_dir.glob("*/metrics.json"):
        folder = metrics_file.parent
        try:
            metrics = json.loads(metrics_file.read_text())
            config = yaml.safe_load((folder / "config.yaml").read_text())
            overrides = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text())
        except (OSError, ValueError, yaml.YAMLError) as error:
            log.warning("rlspeed: %s left out of the comparison: %s", folder, error)
            continue
        # Plain values (a file's interpolations are never resolved here).
        task = config["task"]
        label = task_label(SimpleNamespace(name=str(task["name"]), id=task.get("id")))
        rows.append(
            {
                "job": int(folder.name.split("_", 1)[0]) if folder.name[0].isdigit() else -1,
                **{group: config[group]["name"] for group in ("backend", "env", "algo")},
                "task": label,
                "overrides": list(overrides or []),
                "seeds": metrics.get("num_seeds", 1),
                "status": metrics.get("status", "?"),
                **{key: _number(metrics.get(key)) for key in COLUMNS[8:]},
            }
        )
    rows.sort(key=lambda row: row["job"])
    # What tells the jobs apart: the overrides that are not every job's.
    shared = set.intersection(*(set(row["overrides"]) for row in rows)) if rows else set()
    for row in rows:
        row["overrides"] = " ".join(o for o in row["overrides"] if o not in shared)
    title = "Jobs of the multirun side by side: score and speed per stack"
    return Table("comparison", title, COLUMNS, rows)


def _number(value: Any) -> float:
    """A metric as a float, NaN where the run recorded none (a run that failed early)."""
    return float(value) if isinstance(value, int | float) else float("nan")


def _plot(table: Table, ax: Any) -> None:
    """Env steps/s per job (bars), the score beside each bar."""
    labels = [f"{row['job']}: {row['overrides'][:40]}" for row in table.rows]
    rates = [row["env_steps_per_s"] for row in table.rows]
    bars = ax.barh(labels, rates, color="tab:blue")
    for bar, row in zip(bars, table.rows, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" score {row['score']:.4g}")
    ax.invert_yaxis()
    ax.set_xlabel("env steps/s (whole run)")


def _print(table: Table, sweep_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    shown = RichTable(title="rlspeed multirun: jobs side by side")
    names = ["job", "overrides", "status", "score", "env steps/s", "updates/s", "wall s"]
    for name in names:
        shown.add_column(name, justify="left" if name == "overrides" else "right")
    for row in table.rows:
        shown.add_row(
            str(row["job"]),
            row["overrides"],
            row["status"],
            f"{row['score']:.4f}",
            f"{row['env_steps_per_s']:,.0f}",
            f"{row['updates_per_s']:,.0f}",
            f"{row['wall_time_s']:.1f}",
        )
    Console().print(shown)
    print(f"comparison  {sweep_dir / 'comparison.md'} (.csv, .png)", flush=True)
