"""What a run records, and where: the ``Run`` (its config, task, folder, tracker, monitor
and the files of its agents), the files it writes while it trains (``write_now``, when the
``CheckpointSchedule`` says) and when it ends however it ends (``end``/``ending``:
checkpoints, resume state, learning curve, ``metrics.json`` last), and its summary."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from rich.console import Console
from rich.table import Table

from rlspeed.checkpoint import RESUME_FILE, atomic_write, save_resume, seed_file, write_agent
from rlspeed.config import RunConfig, is_fused, task_label
from rlspeed.core.algos.loops import TrainResult
from rlspeed.core.engines import EngineSpec
from rlspeed.core.tasks import TaskSpec
from rlspeed.monitor import RunMonitor, to_log_file
from rlspeed.seed_streams import RECENT_EPISODES
from rlspeed.sweep import TrialReporter
from rlspeed.tracking import Tracker, cause
from rlspeed.video import VideoSchedule

if TYPE_CHECKING:
    from rlspeed.core import AgentCheckpoint

log = logging.getLogger("rlspeed")


@dataclass
class Run:
    """A run set up to train: what it is, where it records, and its agents' files."""

    # The checked config (rlspeed.validation.check). Dataclasses: the loops read it on every
    # step, where an attribute costs ~30 ns against ~10 us through DictConfig (18% of a
    # CartPole DQN run).
    cfg: RunConfig
    task: TaskSpec
    engine: EngineSpec
    monitor: RunMonitor
    out_dir: Path
    tracker: Tracker
    # backend, env, algo, task: the run's stack, named in its summary.
    choices: dict[str, str]
    # The Optuna trial the run is, if it is one: its pruner may stop the run.
    reporter: TrialReporter | None
    # resume=PATH: per seed index, the saved state that agent continues from.
    resumed: dict[int, dict[str, Any]]
    # The config's training keys (``training_keys``), saved with the resume state: resume=
    # tells a run's files from another's by them.
    training_config: dict[str, Any]
    # False for an env whose state rlspeed cannot save (``engines.env_state``): no resume
    # file is written, as none could continue the run exactly.
    resumable: bool
    # Per seed index (one entry for a fused run's agents together): the files written
    # while it trains and when it ends.
    outputs: dict[int, list[OutputFile]] = field(default_factory=dict)
    # Why periodic checkpoints could not be written (each warned about once).
    unwritten: set[str] = field(default_factory=set)
    # Whether the study's pruner stopped it (it then ends KILLED, as an interrupt does).
    pruned: bool = False
    # video_every: when and where the training agent is filmed (None: never).
    videos: VideoSchedule | None = None
    # The devices it trains on (``platform:id``): a fused run's lanes may spread over several.
    devices: list[str] = field(default_factory=list)
    # init_from=PATH: the weights every agent starts from (None: its seed's).
    initial: AgentCheckpoint | None = None
    # The processes its seeds trained in at once (backend.seed_workers): 1 in its own.
    seed_workers: int = 1

    @property
    def pruned_error(self) -> Any:
        """optuna.TrialPruned for a trial run; () matches nothing (other runs never import
        optuna)."""
        return self.reporter.pruned_error if self.reporter is not None else ()


def set_agent_files(
    run: Run,
    index: int,
    name: str,
    agent_checkpoint: Callable[[], AgentCheckpoint],
    resume_state: Callable[[], dict[str, Any] | None],
) -> None:
    """Agent ``index``'s files: ``agent_checkpoint()`` as its checkpoint, file ``name`` in the run
    folder (``<stem>_seed<i><suffix>`` where the agents of several seeds train one by one),
    and ``resume_state()`` as what ``resume=`` continues from (``RESUME_FILE``, same naming)
    with the run's monitor, tracked run and training keys."""
    path, resume_path = run.out_dir / name, run.out_dir / RESUME_FILE
    if run.cfg.num_seeds > 1 and not is_fused(run.cfg):
        path, resume_path = (seed_file(p, index) for p in (path, resume_path))

    def save_state(path: Path) -> Path:
        taken = resume_state()
        if taken is None:  # stopped inside an iteration: the last file written stays
            return path
        state = {
            **taken,
            "monitor": run.monitor.state_dict(),
            "tracked_run_id": run.tracker.run_id,
            "config": run.training_config,
        }
        return save_resume(state, path)

    # The resume state stays in the run folder: it holds the replay buffer (large).
    run.outputs[index] = [OutputFile(path, lambda to: write_agent(agent_checkpoint(), to))]
    if run.resumable:
        resume = OutputFile(resume_path, save_state, artifact=False, resume_state=True)
        run.outputs[index].append(resume)


def write_now(run: Run, index: int, step: int) -> bool:
    """Write agent ``index``'s files (``run.outputs``) now, at env step ``step`` of its
    training: a run killed outright (SIGKILL, out of memory) resumes from them. One that
    cannot be written costs a warning (once per reason): training goes on, and the files
    written when the run ends say what could not be written. True once written."""
    started = time.monotonic()
    try:
        for output in run.outputs[index]:
            output.write(output.path)
    except OSError as error:
        why = cause(error)
        if why not in run.unwritten:
            run.unwritten.add(why)
            log.warning("rlspeed: could not write a checkpoint in %s: %s", run.out_dir, why)
        return False
    seconds = time.monotonic() - started
    to_log_file(f"rlspeed: checkpoint at env step {step:,} written in {seconds:.3f} s")
    return True


@dataclass(frozen=True)
class OutputFile:
    """A file the run writes when it ends: where, how, and whether MLflow gets a copy."""

    path: Path
    write: Callable[[Path], object]
    artifact: bool = True
    # What resume= continues from (not needed once the run has finished).
    resume_state: bool = False


# checkpoint_every=auto: the least training time between two periodic writes, and the
# least multiple of the last write's duration (49: writes take at most 1/50 of the time).
AUTO_PERIOD_S = 30.0
AUTO_WRITE_RATIO = 49.0


class CheckpointSchedule:
    """When a run writes its checkpoint and resume state while it trains (``checkpoint_every``):
    an integer N at the first whole iteration that reaches each multiple of N env steps, 0
    never, ``auto`` once ``AUTO_PERIOD_S`` of training have passed since the last write and
    ``AUTO_WRITE_RATIO`` times as long as that write took; never at ``total_steps``, where
    the run's end writes them. ``write(step)`` saves (True once written); the loop calls
    ``reached(step)`` where its state is a whole iteration's (what resume= continues from)."""

    def __init__(self, every: int | str, total_steps: int, write: Callable[[int], bool]) -> None:
        self.every, self.total_steps, self.write = every, total_steps, write
        self._block = 0  # the multiple of ``every`` the last write (or the start) was in
        self._since = time.monotonic()
        self._wait_s = AUTO_PERIOD_S
        # The env step of the last write while training (None before the first).
        self.written: int | None = None

    def start(self, step: int) -> None:
        """Training starts (or resumes) at env step ``step``."""
        if isinstance(self.every, int) and self.every > 0:
            self._block = step // self.every
        self._since = time.monotonic()

    def reached(self, step: int) -> None:
        if step >= self.total_steps:
            return
        if isinstance(self.every, str):  # auto
            due = time.monotonic() - self._since >= self._wait_s
        else:
            due = self.every > 0 and step // self.every > self._block
        if not due:
            return
        started = time.monotonic()
        if self.write(step):
            self.written = step
        self._since = time.monotonic()
        self._wait_s = max(AUTO_PERIOD_S, AUTO_WRITE_RATIO * (self._since - started))
        if isinstance(self.every, int):
            self._block = step // self.every


class Unrecorded(NamedTuple):
    """What a run could not record: one line saying what, where and why."""

    line: str
    # Every file is in the run folder; only the tracking store lacks records.
    remote_only: bool


def end(run: Run, status: str, failure: str | None = None) -> Unrecorded | None:
    """Save the outputs and end the tracked run (``failure``: why it failed); what could not
    be recorded, or None."""
    steps = ending(run, status, failure)
    next(steps)
    return next(steps)


def ending(run: Run, status: str, failure: str | None = None) -> Iterator[Unrecorded | None]:
    """``_finishing``'s two steps in the monitor's saving phase; the monitor is closed
    before the second step yields (the summary comes after it)."""
    monitor = run.monitor
    monitor.saving()
    finishing = _finishing(run, status, failure)
    try:
        yield next(finishing)
        unrecorded = next(finishing)
    finally:
        monitor.close()
    yield unrecorded


def _finishing(run: Run, status: str, failure: str | None) -> Iterator[Unrecorded | None]:
    """Save the run's outputs and close the tracked run, however training ended, in two
    steps: the first writes every file and queues its upload (yields None); the second
    waits for the tracking store, writes metrics.json, ends the tracked run and yields what
    could not be recorded (the run is then FAILED where it would have FINISHED; a sweep's
    trial that lost only its tracking store's copy stays FINISHED), or None. A batch of
    trials takes every trial's first step before any second step (``run_trials``): the
    trials' tracking writers upload while the next trial's files are drawn.

    Each file is written on its own (atomically), so one that cannot be written, on a full
    disk say, costs only itself. ``failure``, why training failed, comes first in
    metrics.json's ``errors``."""
    out_dir, monitor, tracker = run.out_dir, run.monitor, run.tracker
    failed: dict[str, list[str]] = {}  # why -> the files that could not be written

    def save(output: OutputFile) -> bool:
        try:
            output.write(output.path)
        except Exception as error:  # costs this file alone; reported in the returned line
            failed.setdefault(cause(error), []).append(output.path.name)
            return False
        return True

    def write(output: OutputFile) -> None:
        if save(output) and output.artifact:
            tracker.log_artifact(output.path)

    def problems() -> list[str]:
        lines = [
            f"could not write {', '.join(names)} in {out_dir}: {why}"
            for why, names in failed.items()
        ]
        if tracker.failure is not None:
            lines.append(
                f"{tracker.failure}, so the run is not fully recorded there; "
                f"its outputs are in {out_dir}"
            )
        return lines

    def final_status() -> str:
        lost = failed or (tracker.failure is not None and run.cfg.trial.number is None)
        return "FAILED" if status == "FINISHED" and lost else status

    final = status
    try:
        # Every agent's files on disk first, uploads after: a preempted job has seconds before
        # SLURM kills it, and its requeued attempt continues from these files.
        outputs = [output for files in run.outputs.values() for output in files]
        trial = run.cfg.trial
        done = status in ("FINISHED", "FAILED") or run.pruned
        if done and trial.number is not None and not trial.keep_resume:
            # A trial that finished, failed or was pruned keeps its agent and metrics; its
            # resume state (the replay buffer) could only continue a run no sweep continues
            # (a rerun samples new trials; only an interrupted one is resumed). A periodic
            # checkpoint may have written it already.
            for output in outputs:
                if output.resume_state:
                    output.path.unlink(missing_ok=True)
            outputs = [output for output in outputs if not output.resume_state]
        saved = [output for output in outputs if save(output)]
        tracker.log_artifact(out_dir / "config.yaml")
        for output in saved:
            if output.artifact:
                tracker.log_artifact(output.path)
        if _curves(monitor):
            write(OutputFile(out_dir / "learning_curve.png", partial(_plot_curve, run)))
        yield None
        # Written last: its status and errors cover the files above and every metric row
        # (the tracker has written all it was given, or says why not).
        tracker.flush()
        errors = [failure, *problems()] if failure else problems()
        # W&B's run id is no MLflow run's: metrics.json has it as wandb_run_id.
        key = "wandb_run_id" if run.cfg.tracking.name == "wandb" else "mlflow_run_id"
        metrics = partial(
            write_metrics,
            monitor,
            status=final_status(),
            errors=errors,
            run_id=tracker.run_id,
            id_key=key,
            devices=run.devices,
            seed_workers=run.seed_workers,
        )
        write(OutputFile(out_dir / "metrics.json", metrics))
        final = final_status()
    finally:
        tracker.end(final)
    lines = problems()  # ending the tracked run may have failed too
    yield Unrecorded("rlspeed: " + "; ".join(lines), not failed) if lines else None


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda file: file.write(text.encode()))


def write_metrics(
    monitor: RunMonitor,
    path: Path,
    status: str,
    errors: list[str],
    run_id: str | None,
    id_key: str = "mlflow_run_id",
    devices: list[str] | None = None,
    seed_workers: int = 1,
) -> Path:
    summary = {
        "status": status,
        # Why the run is not fully recorded (a full disk, a dead tracking server); [] if it is.
        "errors": errors,
        # The tracked run's id as ``id_key``: MLflow's, or W&B's as wandb_run_id (null where
        # there is none).
        "mlflow_run_id": None,
        id_key: run_id,
        "num_seeds": monitor.num_seeds,
        # Where it trained (platform:id): a fused run's lanes spread over these.
        "devices": devices or [],
        # The processes its seeds trained in at once (backend.seed_workers; 1: its own).
        "seed_workers": seed_workers,
        # Means over seeds where num_seeds > 1; per-seed values under "seeds".
        "score": monitor.score,
        "rolling_step_reward": monitor.rolling_step_reward,
        "recent_return": monitor.recent_return,
        # Summed over seeds: agent-steps and updates of all agents together.
        "env_steps": monitor.steps,
        "gradient_updates": monitor.updates,
        "wall_time_s": monitor.wall_time,
        "env_steps_per_s": monitor.steps / monitor.wall_time,
        "updates_per_s": monitor.updates / monitor.wall_time,
        # Fused path: of wall_time_s, the seconds in the compiled chunk calls (null elsewhere).
        "compiled_calls_s": monitor.compiled_calls_s,
        # The last logged row (None if the run stopped before its first log).
        "final": monitor.history[-1] if monitor.history else None,
        # Every logged row, as the tracker got it (MLflow: each metric's history).
        "history": monitor.history,
    }
    if monitor.num_seeds > 1:
        summary["seeds"] = [
            {
                **seed,
                "final": rows[-1] if rows else None,
                # Logged to the tracker as seed<i>/<name>.
                "history": rows,
            }
            for seed, rows in zip(monitor.seed_summaries(), monitor.seed_history, strict=True)
        ]
    return write_text(path, json.dumps(json_safe(summary), indent=2, allow_nan=False))


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite as None: metrics.json is strict JSON
    (a run stopped before its first evaluation has no score: null, not NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _curves(monitor: RunMonitor) -> list[tuple[str, list[dict[str, float]]]]:
    """(label suffix, rows) of each curve to plot: the rows of every seed together (means
    where num_seeds > 1); else, for a multi-seed run stopped before every seed logged a step,
    each seed's own rows."""
    if monitor.history:
        return [("", monitor.history)]
    return [(f", seed {i}", rows) for i, rows in enumerate(monitor.seed_history) if rows]


def _plot_curve(run: Run, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monitor = run.monitor
    mean = monitor.num_seeds > 1 and bool(monitor.history)
    returns = ("charts/episodic_return", "episodic return (training)")
    score = ("eval/score", "score (greedy evaluation)")
    step_reward = ("charts/rolling_step_reward", "rolling step reward (training)")
    # One panel per scale: Doors' score is a step reward ratio, other tasks' a mean return.
    panels = [[returns], [step_reward, score]] if run.task.step_reward else [[returns, score]]
    # Only panels with something logged (a run stopped early may have no evaluation yet).
    logged = {name for _, curve in _curves(monitor) for row in curve for name in row}
    panels = [panel for panel in panels if logged & {name for name, _ in panel}] or panels[:1]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for name, label in panel:
            for suffix, curve in _curves(monitor):
                rows = [row for row in curve if name in row]
                if rows:
                    steps = np.array([row["step"] for row in rows])
                    values = np.array([row[name] for row in rows])
                    marker = "o" if name == "eval/score" else None
                    ax.plot(steps, values, marker=marker, label=label + suffix)
                    if mean:
                        spread = np.array([row[f"{name}_std"] for row in rows])
                        ax.fill_between(steps, values - spread, values + spread, alpha=0.2)
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
        ax.legend()
    cfg = run.cfg
    stack = f"{cfg.algo.name} on {task_label(cfg.task)}, {cfg.backend.name} + {cfg.env.name}"
    if mean:
        fig.suptitle(f"{stack}: learning curve (mean ± std over {monitor.num_seeds} seeds)")
    elif monitor.num_seeds > 1:
        fig.suptitle(f"{stack}: learning curve (stopped before all {monitor.num_seeds} seeds)")
    else:
        fig.suptitle(f"{stack}: learning curve")
    fig.tight_layout()
    try:
        return atomic_write(path, lambda file: fig.savefig(file, format="png", dpi=100))
    finally:
        plt.close(fig)


def _size(folder: Path) -> str:
    """The bytes of every file in ``folder`` (its resume state holds the replay buffer)."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):  # a file gone meanwhile
            total += path.stat().st_size if path.is_file() else 0
    if total < 1000:
        return f"{total} B"
    exponent = min(int(math.log(total, 1000)), 3)
    return f"{total / 1000**exponent:,.1f} {('kB', 'MB', 'GB')[exponent - 1]}"


def summary(run: Run, result: TrainResult) -> None:
    """The run's numbers as a table, then where its outputs are as plain lines (a terminal
    wraps a long path, rich would cut it to the width); the log file gets both."""
    monitor = run.monitor
    table = Table(title="rlspeed run", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for key, value in run.choices.items():
        table.add_row(key, value)
    devices = run.devices
    table.add_row("devices" if len(devices) > 1 else "device", ", ".join(devices))
    wall = monitor.wall_time
    seeds = f" (mean of {monitor.num_seeds} seeds)" if monitor.num_seeds > 1 else ""
    rows = [
        ("seeds", str(monitor.num_seeds)),
        *([("seed workers", str(run.seed_workers))] if run.seed_workers > 1 else []),
        ("env steps", f"{result.steps:,}"),
        ("gradient updates", f"{result.updates:,}"),
        ("wall time", f"{wall:.1f} s"),
        ("env steps/s", f"{result.steps / wall:,.0f}"),
        ("updates/s", f"{result.updates / wall:,.0f}"),
        (f"score{seeds}", f"{monitor.score:.4f}"),
    ]
    if run.task.step_reward:
        rows.append(("rolling step reward", f"{monitor.rolling_step_reward:.4f}"))
    rows.append((f"return, last {RECENT_EPISODES} episodes", f"{monitor.recent_return:.2f}"))
    rows.append(("run folder size", _size(run.out_dir)))
    for key, value in rows:
        table.add_row(key, value)
    where = [("outputs", str(run.out_dir.resolve()))]
    for files in run.outputs.values():
        # The agent's checkpoint (the MLflow artifact), not the resume state beside it.
        where += [("checkpoint", str(f.path.resolve())) for f in files if f.artifact]
    if run.videos is not None and run.videos.written:
        where.append(("videos", str(run.videos.folder.resolve())))
    if run.tracker.run_id is not None:
        label = {"wandb": "W&B run id"}.get(run.cfg.tracking.name, "MLflow run id")
        where.append((label, run.tracker.run_id))
    where += run.tracker.links().items()
    width = max(len(key) for key, _ in where)
    lines = "\n".join(f"{key:<{width}}  {value}" for key, value in where)
    # A sweep's trial keeps its summary in its log file; the sweep prints one line for it.
    trial = run.cfg.trial.number is not None
    console = Console(record=True, file=io.StringIO() if trial else None)
    console.print(table)
    if not trial:
        print(lines, flush=True)
    to_log_file("\n" + console.export_text() + lines)
