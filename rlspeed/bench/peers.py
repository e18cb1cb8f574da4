"""Whole processes of other projects' programs against the ``rlspeed`` command, as
``purejaxrl``, ``jaxenvs`` and ``sacpqn`` time them: each program from its start to its exit,
in turns, the medians of several runs, at equal env steps and gradient updates.

None of the peers' code is in this repository and none is a dependency of rlspeed: the user
saves a copy of PureJaxRL's or CleanRL's repository (``--purejaxrl DIR``, ``--cleanrl DIR``)
and makes a Python with what it needs (``--purejaxrl-python``, ``--cleanrl-python``), or a
Python with rejax installed (``--rejax``). ``HOW_TO_GET`` says how; a peer not given is left
out, in one line on stderr and in the results' notes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table

PEERS = ("purejaxrl", "rejax", "cleanrl")
# The Python that runs PureJaxRL's scripts and rejax: both were written against gymnax's
# old step API (5 results), which gymnax 0.0.9 still has (rejax 0.1.3 steps it too); the
# same jax as rlspeed's, so both sides compile with the same XLA.
JAX_PEER_VENV = (
    "python3.11 -m venv /tmp/venv-jaxpeers && /tmp/venv-jaxpeers/bin/pip install"
    f" jax=={metadata.version('jax')} gymnax==0.0.9 rejax==0.1.3 distrax flax optax"
)
HOW_TO_GET = {
    "purejaxrl": "PureJaxRL (github.com/luchris429/purejaxrl, not on PyPI): save the"
    " repository as DIR (git clone https://github.com/luchris429/purejaxrl DIR), make a"
    f" Python for it ({JAX_PEER_VENV}) and give --purejaxrl DIR --purejaxrl-python"
    " /tmp/venv-jaxpeers/bin/python",
    "rejax": f"rejax: make a Python with it ({JAX_PEER_VENV}) and give --rejax"
    " /tmp/venv-jaxpeers/bin/python",
    "cleanrl": "CleanRL (its scripts are not in the cleanrl package on PyPI): save the"
    " repository as DIR (git clone https://github.com/vwxyzjn/cleanrl DIR), make a Python for"
    " it (python3.11 -m venv /tmp/venv-cleanrl && /tmp/venv-cleanrl/bin/pip install torch"
    " gymnasium==0.29.1 'numpy<2' tyro tensorboard) and give --cleanrl DIR --cleanrl-python"
    " /tmp/venv-cleanrl/bin/python",
}
# A --quick benchmark's program takes 10-40 s on a 2-core CPU (compiling included); one that
# runs far longer is stuck, and the benchmark names it rather than waiting.
QUICK_TIMEOUT_S = 180.0
# The files of a saved repository that the benchmarks run, per peer given as a folder.
NEEDS = {
    "purejaxrl": ("purejaxrl/ppo.py",),
    "cleanrl": ("cleanrl/sac_continuous_action.py", "cleanrl/pqn.py", "cleanrl_utils"),
}
DRIVER = Path(__file__).with_name("peer_run.py")


@dataclass(frozen=True)
class Peers:
    """Where each peer is: a saved repository (purejaxrl, cleanrl) or nothing, and the
    Python that runs it (for rejax, the Python that has it installed)."""

    folders: dict[str, Path] = field(default_factory=dict)
    pythons: dict[str, str] = field(default_factory=dict)

    def has(self, peer: str) -> bool:
        return peer in self.pythons and (peer == "rejax" or peer in self.folders)


def find_peers(
    purejaxrl: Path | None = None,
    purejaxrl_python: str | None = None,
    rejax: str | None = None,
    cleanrl: Path | None = None,
    cleanrl_python: str | None = None,
) -> Peers:
    """The peers given on the command line; a ValueError in one line where one is given
    but is not there (a folder without the scripts, a Python that is not a file)."""
    folders, pythons = {}, {}
    for peer, folder, python in (
        ("purejaxrl", purejaxrl, purejaxrl_python),
        ("cleanrl", cleanrl, cleanrl_python),
    ):
        if folder is None:
            continue
        missing = [name for name in NEEDS[peer] if not (folder / name).exists()]
        if missing:
            raise ValueError(
                f"rlspeed-bench: invalid --{peer}={folder}: expected a saved copy of the"
                f" repository, with {', '.join(missing)}; {HOW_TO_GET[peer]}"
            )
        folders[peer] = folder.resolve()
        pythons[peer] = python or sys.executable
    if rejax is not None:
        pythons["rejax"] = rejax
    for option, python in (
        ("--purejaxrl-python", purejaxrl_python),
        ("--cleanrl-python", cleanrl_python),
        ("--rejax", rejax),
    ):
        if python is not None and not Path(python).is_file():
            raise ValueError(
                f"rlspeed-bench: invalid {option}={python}: expected the path of a Python"
            )
    return Peers(folders, pythons)


def missing_peers(peers: Peers, wanted: tuple[str, ...]) -> list[str]:
    """One line per peer in ``wanted`` that was not given: what is left out, how to get it."""
    return [f"{p} left out: {HOW_TO_GET[p]}" for p in wanted if not peers.has(p)]


@dataclass
class ProcessTime:
    wall_s: float  # process start to exit
    cpu_s: float  # user + system time of the process and the children it waited for


def time_process(
    command: list[str],
    cwd: Path,
    log: Path,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> ProcessTime:
    """Run ``command`` to its end; its output goes to ``log``. RuntimeError if it fails or,
    given ``timeout_s``, if it has not ended by then (it is killed): a benchmark names the
    program that hangs instead of waiting on it."""
    with log.open("w") as out:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        killer = threading.Timer(timeout_s, process.kill) if timeout_s else None
        if killer:
            killer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            if killer:
                killer.cancel()
        wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        if timeout_s is not None and wall >= timeout_s:
            raise RuntimeError(
                f"{shlex.join(command)} had not ended after {timeout_s:.0f} s: {tail}"
            )
        raise RuntimeError(f"{command[0]} failed ({process.returncode}): {tail}")
    return ProcessTime(wall, usage.ru_utime + usage.ru_stime)


@dataclass(frozen=True)
class Side:
    """One program of a workload. ``peer`` None: the rlspeed command with ``args`` as its
    overrides; else the peer's program: for purejaxrl and rejax ``args`` are
    ``peer_run.py``'s (the script or algorithm, then its options), for cleanrl the script's
    path in the repository and its options. ``work``: the peer's env steps and gradient
    updates as its loop counts them (rlspeed's come from its metrics.json)."""

    label: str
    peer: str | None
    args: tuple[str, ...]
    work: tuple[int, int] | None = None
    seeds: int = 1


@dataclass(frozen=True)
class Workload:
    """Programs doing the same training; the first side is the reference of the ratios."""

    name: str
    sides: tuple[Side, ...]
    about: str


def rlspeed_side(label: str, overrides: list[str], seeds: int = 1) -> Side:
    return Side(label, None, tuple(overrides), seeds=seeds)


def json_config(config: dict[str, Any]) -> str:
    return json.dumps(config, separators=(",", ":"))


@dataclass
class Outcome:
    time: ProcessTime
    env_steps: int
    updates: int
    value: float  # the return reached (what kind: the workload's notes)
    # What peer_run.py said of the run besides its return (PureJaxRL: the wrappers it used).
    info: dict[str, Any] = field(default_factory=dict)


def _command(side: Side, peers: Peers, run_dir: Path, cache: Path) -> tuple[list[str], Any]:
    if side.peer is None:
        rlspeed = str(Path(sys.executable).with_name("rlspeed"))
        overrides = [*side.args, f"backend.compilation_cache={cache}", f"hydra.run.dir={run_dir}"]
        return [rlspeed, *overrides], None
    python = peers.pythons[side.peer]
    if side.peer == "cleanrl":
        script, *options = side.args
        env = {**os.environ, "PYTHONPATH": str(peers.folders["cleanrl"])}  # cleanrl_utils
        return [python, str(peers.folders["cleanrl"] / script), *options], env
    what, *options = side.args
    if side.peer == "purejaxrl":
        what = str(peers.folders["purejaxrl"] / what)
    return [python, str(DRIVER), side.peer, what, *options], None


# CleanRL's scripts print each finished episode: global_step=..., episodic_return=[...].
_EPISODE = re.compile(r"episodic_return=\[?\s*(-?[0-9.eE+-]+)")


def _outcome(side: Side, time_taken: ProcessTime, run_dir: Path, log: Path) -> Outcome:
    if side.peer is None:
        metrics = json.loads((run_dir / "metrics.json").read_text())
        value = metrics.get("recent_return")
        value = statistics.fmean(value) if isinstance(value, list) else value
        steps, updates = int(metrics["env_steps"]), int(metrics["gradient_updates"])
        return Outcome(time_taken, steps, updates, float("nan") if value is None else value)
    assert side.work is not None, side
    text = log.read_text()
    if side.peer == "cleanrl":
        returns = [float(v) for v in _EPISODE.findall(text)][-20:]
        value = statistics.fmean(returns) if returns else float("nan")
        return Outcome(time_taken, *side.work, value)
    said = json.loads(text.strip().splitlines()[-1])
    info = {k: v for k, v in said.items() if k in ("wrappers",)}
    return Outcome(time_taken, *side.work, said["return"], info)


def run_workloads(
    workloads: list[Workload], peers: Peers, repeats: int, quick: bool
) -> tuple[dict[str, dict[str, list[Outcome]]], dict[str, dict[str, float]]]:
    """Each workload's programs in turns (forward, then backward, ...), ``repeats`` times,
    after one warm-up run each (its time kept as the first run's) unless ``quick``; sides
    whose peer is not given are left out; in a ``quick`` run a process still running after
    ``QUICK_TIMEOUT_S`` is killed and named (RuntimeError). Returns the outcomes and the
    first runs' times.

    rlspeed runs as a user's repeated command does: in one working folder (its MLflow
    store) with one compilation cache, which its first run fills."""
    outcomes: dict[str, dict[str, list[Outcome]]] = {}
    first: dict[str, dict[str, float]] = {}
    timeout_s = QUICK_TIMEOUT_S if quick else None
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-peers-") as tmp:
        work = Path(tmp)
        cache = work / "xla"
        count = 0
        for workload in workloads:
            sides = [s for s in workload.sides if s.peer is None or peers.has(s.peer)]
            outcomes[workload.name] = {s.label: [] for s in sides}
            first[workload.name] = {}

            def one(side: Side) -> Outcome:
                nonlocal count
                count += 1
                run_dir = work / f"run{count:03d}"
                log = work / f"run{count:03d}.log"
                command, env = _command(side, peers, run_dir, cache)
                taken = time_process(command, work, log, env, timeout_s)
                return _outcome(side, taken, run_dir, log)

            if not quick:
                for side in sides:
                    first[workload.name][side.label] = one(side).time.wall_s
            for repeat in range(repeats):
                for side in sides if repeat % 2 == 0 else sides[::-1]:
                    outcomes[workload.name][side.label].append(one(side))
                print(
                    f"  {workload.name} repeat {repeat}: "
                    + ", ".join(
                        f"{label} {runs[-1].time.wall_s:.2f} s"
                        for label, runs in outcomes[workload.name].items()
                    ),
                    flush=True,
                )
    return outcomes, first


def process_time_note(peer: str) -> str:
    """What a row's process time holds on each side; ``peer``: what the peer's program does
    besides training."""
    return (
        "Process time: from starting the process to its exit. rlspeed runs as typed, with its"
        " default MLflow tracking (a local sqlite store), evaluation, checkpoint and outputs; "
        + peer
    )


COLUMNS = [
    "workload", "program", "seeds", "runs", "env_steps", "gradient_updates", "same_work",
    "median_wall_s", "min_wall_s", "max_wall_s", "first_run_s", "median_cpu_s",
    "env_steps_per_s", "return", "wall_vs_reference",
]  # fmt: skip


def peer_table(
    name: str,
    title: str,
    workloads: list[Workload],
    outcomes: dict[str, dict[str, list[Outcome]]],
    first: dict[str, dict[str, float]],
) -> Table:
    """A row per program run; each workload's ratios against its first program."""
    table = Table(name, title, list(COLUMNS))
    for workload in workloads:
        runs_of = outcomes[workload.name]
        seeds_of = {side.label: side.seeds for side in workload.sides}
        reference = statistics.median(o.time.wall_s for o in next(iter(runs_of.values())))
        works = {(o.env_steps, o.updates) for runs in runs_of.values() for o in runs}
        for label, runs in runs_of.items():
            wall = statistics.median(o.time.wall_s for o in runs)
            table.add(
                workload=workload.name,
                program=label,
                seeds=seeds_of[label],
                runs=len(runs),
                env_steps=runs[0].env_steps,
                gradient_updates=runs[0].updates,
                same_work="yes" if len(works) == 1 else f"no: {sorted(works)}",
                median_wall_s=wall,
                min_wall_s=min(o.time.wall_s for o in runs),
                max_wall_s=max(o.time.wall_s for o in runs),
                first_run_s=first[workload.name].get(label, float("nan")),
                median_cpu_s=statistics.median(o.time.cpu_s for o in runs),
                env_steps_per_s=runs[0].env_steps / wall,
                **{"return": statistics.median(o.value for o in runs)},
                wall_vs_reference=wall / reference,
            )
        table.notes.append(f"{workload.name}: {workload.about}")
        for label, runs in runs_of.items():
            for key, value in runs[-1].info.items():
                table.notes.append(f"{workload.name}: {label} ran with {key} = {value}")
    return table


def config_lines(workloads: list[Workload], peers: Peers) -> list[str]:
    """Each program's command line as it ran (rlspeed's less its run folder and cache)."""
    lines = []
    for workload in workloads:
        for side in workload.sides:
            if side.peer is None:
                lines.append(f"{workload.name}: rlspeed {shlex.join(side.args)}")
            elif peers.has(side.peer):
                command, env = _command(side, peers, Path(), Path())
                where = f"PYTHONPATH={env['PYTHONPATH']} " if env else ""
                lines.append(f"{workload.name}: {where}{shlex.join(command)}")
    return lines


# What each peer's Python reports of itself: the libraries its programs ran with.
_VERSIONS = (
    "from importlib import metadata, util\n"
    "for name in {names!r}:\n"
    "    if util.find_spec(name.replace('-', '_')):\n"
    "        print(name, metadata.version(name))\n"
)
LIBRARIES = {
    "purejaxrl": ("jax", "jaxlib", "flax", "optax", "distrax", "gymnax", "numpy"),
    "rejax": ("rejax", "jax", "jaxlib", "flax", "optax", "distrax", "gymnax", "numpy"),
    "cleanrl": ("torch", "gymnasium", "numpy", "tyro", "tensorboard"),
}


def peer_versions(peers: Peers, wanted: tuple[str, ...]) -> list[str]:
    """A line per peer given in ``wanted``: its Python and the versions of its libraries."""
    lines = []
    for peer in wanted:
        if not peers.has(peer):
            continue
        python = peers.pythons[peer]
        code = _VERSIONS.format(names=LIBRARIES[peer])
        out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout
        found = ", ".join(out.split("\n")[:-1]) or "(no versions found)"
        folder = peers.folders.get(peer)
        source = f"; {folder} at {_head(folder)}" if folder else ""
        lines.append(f"{peer}: {python}: {found}{source}")
    return lines


def _head(folder: Path) -> str:
    """The git commit of a saved repository, if it is a git clone."""
    result = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else "an unknown commit (no git)"


def verdicts(table: Table, targets: dict[str, tuple[str, float]]) -> list[str]:
    """A line per rlspeed row and peer of its workload whose ratio has a target:
    ``targets`` maps a program label's prefix to (the peer label's prefix, the ratio)."""
    lines = []
    for row in table.rows:
        for prefix, (peer, target) in targets.items():
            if not row["program"].startswith(prefix):
                continue
            for other in table.rows:
                if other["workload"] == row["workload"] and other["program"].startswith(peer):
                    ratio = row["median_wall_s"] / other["median_wall_s"]
                    lines.append(
                        f"{row['workload']}: {row['program']} / {other['program']} = {ratio:.2f}"
                        f" (target <= {target}: {'met' if ratio <= target else 'missed'})"
                    )
    return lines


def plot_workloads(table: Table, ax: Any) -> None:
    """Median process time per program, grouped by workload (bars: min-max)."""
    labels = [f"{row['workload']}\n{row['program']}" for row in table.rows]
    walls = [row["median_wall_s"] for row in table.rows]
    low = [row["median_wall_s"] - row["min_wall_s"] for row in table.rows]
    high = [row["max_wall_s"] - row["median_wall_s"] for row in table.rows]
    workloads = list(dict.fromkeys(row["workload"] for row in table.rows))
    colors = [f"C{workloads.index(row['workload']) % 10}" for row in table.rows]
    positions = list(range(len(labels)))
    ax.barh(positions, walls, xerr=[low, high], color=colors, capsize=3)
    for i, row in enumerate(table.rows):
        ax.annotate(
            f" {row['wall_vs_reference']:.2f}x", (row["median_wall_s"], i), va="center", fontsize=7
        )
    ax.set_yticks(positions, labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from process start to exit (median; bars: min-max)")
