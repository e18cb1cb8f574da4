"""``against``: this checkout against an earlier git revision, whole processes, interleaved.

The revision is checked out with ``git worktree`` into a temporary folder and run with this
Python and these installed libraries: its folder first on ``PYTHONPATH``. This checkout
runs the same way (its own folder on ``PYTHONPATH``), so both sides pay the same start-up.
A check before any timing prints the ``rlspeed.__file__`` each side imports.

This checkout is also on the path through its editable install (a ``.pth`` file in
site-packages). Left there, the revision's process would find this checkout's
``hydra_plugins`` (Hydra scans every folder of that namespace) and fail on imports the
revision lacks. So both sides start through one launcher, ``python -c``, that removes the
other side's folder from ``sys.path`` and runs ``rlspeed.cli`` as ``python -m`` does
(``runpy``): for this checkout's side it removes nothing.

Per workload: one warm-up run of each side (its compilation cache and MLflow store filled),
then ``repeats`` pairs, old then new, then new then old, in turns. Each side has its own
working folder (its ``mlflow.db``) and its own compilation cache folder: the default
(``~/.cache/rlspeed/xla``) would be shared, and a program both versions compile alike would
be compiled by one and loaded from the cache by the other.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rlspeed
from rlspeed.bench.common import Table, write_results

# Where the results go when --out is not given, inside this checkout.
DEFAULT_OUT = Path("docs") / "benchmarks" / "against"
DEFAULT_REVISIONS = ("origin/main", "HEAD~1")


@dataclass(frozen=True)
class Workload:
    """One fixed ``rlspeed`` command; ``steps`` is (full, quick) total_steps; ``tracking``
    the variants run (``--quick`` runs the first only)."""

    name: str
    overrides: tuple[str, ...]
    steps: tuple[int, int]
    tracking: tuple[str, ...]


# Sized for ~6-15 s per process on a 2-core CPU (~4 s of it start-up: imports, config
# checks, outputs), ~4-6 s with --quick (mostly start-up).
WORKLOADS = (
    # The host loop: Python per iteration shows here (one update per env step after 5,000).
    Workload(
        "dqn-torch-gym-cartpole",
        ("backend=torch", "env=gym-sync", "algo=dqn", "task=cartpole"),
        (12_000, 5_500),
        ("none",),
    ),
    Workload(
        "ppo-torch-gym-cartpole",
        ("backend=torch", "env=gym-sync", "algo=ppo", "task=cartpole"),
        (40_960, 5_120),
        ("none",),
    ),
    # The host loop around a jitted learner.
    Workload(
        "dqn-flax-gym-cartpole",
        ("backend=flax", "env=gym-sync", "algo=dqn", "task=cartpole"),
        (12_000, 5_500),
        ("none",),
    ),
    # The fused path: one compiled call per chunk.
    Workload(
        "ppo-flax-fused-cartpole",
        ("backend=flax", "env=jax-vmap", "algo=ppo", "task=cartpole"),
        (102_400, 20_480),
        ("none", "mlflow"),
    ),
    # `rlspeed` as typed: DQN on Doors, flax + jax-vmap, default tracking (MLflow).
    Workload("default-rlspeed", (), (16_000, 5_000), ("mlflow", "none")),
    Workload(
        "ppo-flax-fused-cartpole-16-seeds",
        ("backend=flax", "env=jax-vmap", "algo=ppo", "task=cartpole", "num_seeds=16"),
        (10_240, 2_560),
        ("none",),
    ),
)

COLUMNS = [
    "workload",
    "tracking",
    "pairs",
    "old_s",
    "new_s",
    "ratio",
    "ratio_min",
    "ratio_max",
    "old_env_steps_per_s",
    "new_env_steps_per_s",
    "old_updates_per_s",
    "new_updates_per_s",
    "env_steps",
    "gradient_updates",
    "same_work",
]

# Runs rlspeed.cli as `python -m` would, once the other side's folder is off sys.path.
LAUNCHER = (
    "import runpy, sys; drop = {drop!r}; sys.path[:] = [p for p in sys.path if p not in drop];"
    " runpy.run_module('rlspeed.cli', run_name='__main__', alter_sys=True)"
)
CHECK = (
    "import sys; drop = {drop!r}; sys.path[:] = [p for p in sys.path if p not in drop];"
    " import rlspeed; print(rlspeed.__file__)"
)


def checkout_root() -> Path:
    """The folder this process's ``rlspeed`` package is in (the checkout compared)."""
    return Path(rlspeed.__file__).resolve().parents[1]


def _git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(cwd or checkout_root()), *args], capture_output=True, text=True
    )


def resolve_revision(rev: str | None) -> tuple[str, str, str]:
    """(the revision as asked or picked, its full commit hash, how it was picked); a
    ValueError in one line when git or the revision is missing."""
    candidates = [rev] if rev else list(DEFAULT_REVISIONS)
    for candidate in candidates:
        try:
            found = _git("rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}")
        except OSError as error:
            raise ValueError(f"rlspeed-bench against needs git: {error}") from None
        if found.returncode == 0:
            how = (
                "given with --rev"
                if rev
                else (
                    f"the default: {candidate}"
                    + (" (no origin/main in this clone)" if candidate != candidates[0] else "")
                )
            )
            return candidate, found.stdout.strip(), how
    if rev:
        raise ValueError(
            f"rlspeed-bench: invalid --rev={rev}: expected a git revision of"
            f" {checkout_root()} (a commit, branch or tag)"
        )
    raise ValueError(
        f"rlspeed-bench against: neither origin/main nor HEAD~1 is a commit in"
        f" {checkout_root()}: give --rev"
    )


def revision_problem(rev: str | None) -> str | None:
    """One line when ``rev`` (or the default) names no commit of this checkout."""
    try:
        resolve_revision(rev)
    except ValueError as error:
        return str(error)
    return None


@contextmanager
def worktree(commit: str, folder: Path) -> Iterator[Path]:
    """``commit`` checked out (detached) in ``folder``; removed from git's list on exit."""
    added = _git("worktree", "add", "--detach", str(folder), commit)
    if added.returncode != 0:
        raise RuntimeError(f"git worktree add {commit} failed: {added.stderr.strip()}")
    try:
        yield folder
    finally:
        _git("worktree", "remove", "--force", str(folder))
        _git("worktree", "prune")


@dataclass
class Side:
    """One version: its code's folder, the path entries its processes drop, where it runs."""

    label: str
    root: Path
    drop: tuple[str, ...]
    work: Path
    runs: int = 0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        others = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.root), *(p for p in others if p not in self.drop)]
        )
        return env

    def imported_rlspeed(self) -> str:
        """``rlspeed.__file__`` in a process started as the timed ones are; a RuntimeError
        unless it is this side's own."""
        result = subprocess.run(
            [sys.executable, "-c", CHECK.format(drop=self.drop)],
            cwd=self.work,
            env=self.env(),
            capture_output=True,
            text=True,
        )
        path = result.stdout.strip()
        if result.returncode != 0 or not Path(path).resolve().is_relative_to(self.root.resolve()):
            raise RuntimeError(
                f"the {self.label} side imports rlspeed from {path or result.stderr[-300:]},"
                f" not from {self.root}"
            )
        return path

    def train(self, name: str, overrides: list[str]) -> dict[str, Any]:
        """One ``rlspeed`` process in a fresh run folder: its ``metrics.json`` with
        ``process_s``, the time from process start to exit."""
        self.runs += 1
        run_dir = self.work / "runs" / f"{self.runs:03d}-{name}"
        command = [
            sys.executable, "-c", LAUNCHER.format(drop=self.drop), *overrides,
            f"backend.compilation_cache={self.work / 'xla'}", "progress=none",
            f"hydra.run.dir={run_dir}",
        ]  # fmt: skip
        start = time.perf_counter()
        result = subprocess.run(
            command, cwd=self.work, env=self.env(), capture_output=True, text=True, timeout=1800
        )
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
            raise RuntimeError(
                f"{self.label}: rlspeed {' '.join(overrides)} failed: " + " | ".join(tail)
            )
        metrics: dict[str, Any] = json.loads((run_dir / "metrics.json").read_text())
        metrics["process_s"] = seconds
        return metrics


def load() -> str:
    """The machine's load as ``uptime`` says it."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def add_row(
    table: Table, workload: str, tracking: str, old: list[dict[str, Any]], new: list[dict[str, Any]]
) -> None:
    ratios = [n["process_s"] / o["process_s"] for o, n in zip(old, new, strict=True)]
    work = {(r["env_steps"], r["gradient_updates"]) for r in old + new}

    def median(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(r[key]) for r in runs)

    table.add(
        workload=workload,
        tracking=tracking,
        pairs=len(ratios),
        old_s=median(old, "process_s"),
        new_s=median(new, "process_s"),
        ratio=statistics.median(ratios),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
        old_env_steps_per_s=median(old, "env_steps_per_s"),
        new_env_steps_per_s=median(new, "env_steps_per_s"),
        old_updates_per_s=median(old, "updates_per_s"),
        new_updates_per_s=median(new, "updates_per_s"),
        env_steps=old[0]["env_steps"],
        gradient_updates=old[0]["gradient_updates"],
        same_work="yes" if len(work) == 1 else f"no: {sorted(work)}",
    )


def run(
    out_dir: Path | None,
    quick: bool,
    compose: Any,
    rev: str | None = None,
    repeats: int | None = None,
) -> list[Path]:
    """Time every workload on both sides in interleaved pairs; write the medians."""
    asked, commit, how = resolve_revision(rev)
    repeats = repeats or (2 if quick else 5)
    root = checkout_root()
    out_dir = out_dir if out_dir is not None else root / DEFAULT_OUT
    head = _git("rev-parse", "--short", "HEAD").stdout.strip()
    dirty = _git("status", "--porcelain", "--", "rlspeed", "conf", "hydra_plugins").stdout
    new_label = f"this checkout ({root}, HEAD {head}" + (
        ", with uncommitted changes to rlspeed/, conf/ or hydra_plugins/)" if dirty else ")"
    )
    print(f"   old: {asked} = {commit} ({how}); new: {new_label}", flush=True)
    load_before = load()
    print(f"   load before: {load_before}", flush=True)
    table = Table(
        "against",
        f"This checkout against {asked} ({commit[:10]}): whole rlspeed processes, interleaved",
        COLUMNS,
    )
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-against-") as tmp:
        folder = Path(tmp)
        with worktree(commit, folder / "revision") as old_root:
            sides = {
                "old": Side("old", old_root, (str(root),), folder / "old"),
                "new": Side("new", root, (), folder / "new"),
            }
            imported = {}
            for side in sides.values():
                side.work.mkdir()
                imported[side.label] = side.imported_rlspeed()
                print(f"   {side.label} imports {imported[side.label]}", flush=True)
            for workload in WORKLOADS:
                steps = workload.steps[1] if quick else workload.steps[0]
                variants = workload.tracking[:1] if quick else workload.tracking
                base = [*workload.overrides, f"total_steps={steps}"]
                for tracking in variants:
                    table.configs.append(
                        f"{workload.name}: rlspeed " + " ".join([*base, f"tracking={tracking}"])
                    )
                # Warm-up: compiles and caches the programs; with MLflow, creates the store.
                warm = "mlflow" if "mlflow" in variants else variants[0]
                for label in ("old", "new"):
                    sides[label].train(workload.name, [*base, f"tracking={warm}"])
                runs: dict[str, dict[str, list[dict[str, Any]]]] = {
                    t: {"old": [], "new": []} for t in variants
                }
                for repeat in range(repeats):
                    for tracking in variants:
                        order = ("old", "new") if repeat % 2 == 0 else ("new", "old")
                        for label in order:
                            metrics = sides[label].train(
                                workload.name, [*base, f"tracking={tracking}"]
                            )
                            runs[tracking][label].append(metrics)
                for tracking in variants:
                    add_row(
                        table, workload.name, tracking, runs[tracking]["old"], runs[tracking]["new"]
                    )
    load_after = load()
    print(f"   load after: {load_after}", flush=True)
    table.notes += [
        f"old: {asked} = {commit} ({how}), checked out with git worktree; imports"
        f" rlspeed from {imported['old']} (the temporary worktree).",
        f"new: {new_label}; imports rlspeed from {imported['new']}.",
        "Both sides: this Python and its installed libraries, started as"
        " `python -c <launcher>` with the side's folder first on PYTHONPATH; the launcher"
        " takes the other side's folder off sys.path (this checkout is also there through"
        " its editable install, and the revision's process would otherwise load this"
        " checkout's hydra_plugins) and runs rlspeed.cli as `python -m` does.",
        "Compilation cache: each side its own folder (backend.compilation_cache), filled by"
        " its warm-up run, so both run warm from their own cache; the default"
        " (~/.cache/rlspeed/xla) would be shared between the versions. MLflow: each side"
        " its own working folder and store (sqlite:///mlflow.db), created by its warm-up.",
        f"Per workload, one warm-up run of each side, then {repeats} pairs in turns: old"
        " then new, then new then old. old_s, new_s: median seconds from process start to"
        " exit. ratio: median over the pairs of new_s / old_s (below 1: the new code is"
        " faster); ratio_min, ratio_max: the spread over the pairs.",
        "env_steps_per_s, updates_per_s: medians of each run's metrics.json (the training"
        " loop's rate, start-up excluded). same_work: every run of both sides did the same"
        " env steps and gradient updates.",
        f"Machine load (uptime) before: {load_before}",
        f"Machine load (uptime) after: {load_after}",
    ]
    if quick:
        table.notes.append("--quick: small step counts, the first tracking variant only.")
    return write_results(table, out_dir, plot_ratios)


def plot_ratios(table: Table, ax: Any) -> None:
    """Each row's new/old time ratio (median), with the pairs' min-max as the error bar."""
    labels = [f"{row['workload']}\ntracking={row['tracking']}" for row in table.rows]
    ratios = [row["ratio"] for row in table.rows]
    low = [row["ratio"] - row["ratio_min"] for row in table.rows]
    high = [row["ratio_max"] - row["ratio"] for row in table.rows]
    positions = list(range(len(labels)))
    ax.barh(positions, ratios, xerr=[low, high], color="tab:blue", capsize=3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(positions, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("new / old process time (median over pairs; bars: min-max)")
