"""What a training loop gets from its run (``RunContext``): the config, the task, the engine,
the monitor, which agent it trains, where that agent's files go and when they are written
(``CheckpointSchedule``), and what it hands back (``TrainResult``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlspeed.checkpoint import RESUME_FILE, save_resume, seed_file
from rlspeed.config import RunConfig
from rlspeed.engines import Engine, EngineSpec
from rlspeed.monitor import RunMonitor, SeedMonitor, to_log_file
from rlspeed.registry import BACKENDS
from rlspeed.tasks import TaskSpec
from rlspeed.tracking import Tracker, cause

log = logging.getLogger("rlspeed")


@dataclass
class TrainResult:
    steps: int
    updates: int


@dataclass(frozen=True)
class OutputFile:
    """A file the run writes when it ends: where, how, and whether MLflow gets a copy."""

    path: Path
    write: Callable[[Path], object]
    artifact: bool = True
    # What resume= continues from (not needed once the run has finished).
    resume_state: bool = False


@dataclass
class RunContext:
    """What a training loop (``rlspeed.algos.loops``) gets: the config, the task, the
    engine, the monitor, and which of the run's ``num_seeds`` agents it trains."""

    cfg: RunConfig  # plain dataclasses, not DictConfig (see ``run``)
    task: TaskSpec
    engine: EngineSpec
    run_monitor: RunMonitor
    out_dir: Path
    seed_index: int = 0
    # True on the fused path, where one program trains every seed at once.
    all_seeds: bool = False
    # Per seed index: that agent's files (set by the algorithm once the agent exists;
    # written when the run ends, however it ends).
    checkpointers: dict[int, list[OutputFile]] = field(default_factory=dict)
    # resume=PATH: per seed index, the saved state that agent continues from.
    resumed: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The tracker, whose run id is saved with the resume state: a requeued SLURM job
    # continues that run.
    tracker: Tracker | None = None
    # The config's training keys (``training_keys``), saved with the resume state: resume=
    # tells a run's files from another's by them.
    training_config: dict[str, Any] = field(default_factory=dict)
    # Called with (score, env step) after each evaluation is logged; may raise to stop the
    # run (an Optuna trial's reporter raises optuna.TrialPruned when its pruner says so).
    report_score: Callable[[float, int], None] | None = None
    # Why periodic checkpoints could not be written (each warned about once); shared by the
    # seeds' contexts.
    unwritten: set[str] = field(default_factory=set)
    # False for an env whose state rlspeed cannot save (``engines.env_state``): no resume
    # file is written, as none could continue the run exactly.
    resumable: bool = True

    @property
    def seed(self) -> int:
        return self.cfg.seed + self.seed_index

    @property
    def monitor(self) -> SeedMonitor:
        return SeedMonitor(self.run_monitor, self.seed_index)

    def make_engine(self) -> Engine:
        cfg = self.cfg
        return self.engine.make(self.task, cfg.task, cfg.env, cfg.num_envs, self.seed)

    def set_checkpoint(
        self,
        name: str,
        save: Callable[[Path], Path],
        resume_state: Callable[[], dict[str, Any] | None],
    ) -> None:
        """Register ``save(path)`` as this agent's checkpoint, file ``name`` in the run folder
        (``<stem>_seed<i><suffix>`` when agents of several seeds are saved one by one), and
        ``resume_state()`` as what ``resume=`` continues from (``RESUME_FILE``, same naming)."""
        path, resume_path = self.out_dir / name, self.out_dir / RESUME_FILE
        if self.cfg.num_seeds > 1 and not self.all_seeds:
            path, resume_path = (seed_file(p, self.seed_index) for p in (path, resume_path))

        def save_state(path: Path) -> Path:
            taken = resume_state()
            if taken is None:  # stopped inside an iteration: the last file written stays
                return path
            state = {
                **taken,
                "monitor": self.run_monitor.state_dict(),
                "tracked_run_id": self.tracker.run_id if self.tracker else None,
                "config": self.training_config,
            }
            return save_resume(state, path)

        # The resume state stays in the run folder: it holds the replay buffer (large).
        self.checkpointers[self.seed_index] = [OutputFile(path, save)]
        if self.resumable:
            resume = OutputFile(resume_path, save_state, artifact=False, resume_state=True)
            self.checkpointers[self.seed_index].append(resume)

    def resume_state(self) -> dict[str, Any] | None:
        """This agent's saved state when the run resumes one (None otherwise)."""
        return self.resumed.get(self.seed_index)

    def checkpoint_schedule(self) -> CheckpointSchedule:
        """When the training loop writes this agent's files while it trains."""
        cfg = self.cfg
        return CheckpointSchedule(cfg.checkpoint_every, cfg.total_steps, self.write_checkpoint)

    def write_checkpoint(self, step: int) -> bool:
        """Write this agent's files (``set_checkpoint``) now, at env step ``step`` of its
        training: a run killed outright (SIGKILL, out of memory) resumes from them. One that
        cannot be written costs a warning (once per reason): training goes on, and the files
        written when the run ends say what could not be written."""
        started = time.monotonic()
        try:
            for output in self.checkpointers[self.seed_index]:
                output.write(output.path)
        except OSError as error:
            why = cause(error)
            if why not in self.unwritten:
                self.unwritten.add(why)
                log.warning("rlspeed: could not write a checkpoint in %s: %s", self.out_dir, why)
            return False
        seconds = time.monotonic() - started
        to_log_file(f"rlspeed: checkpoint at env step {step:,} written in {seconds:.3f} s")
        return True

    def each_seed(self, train_one: Callable[[RunContext], TrainResult]) -> TrainResult:
        """Train the ``num_seeds`` agents one after another (the host-driven paths)."""
        steps = updates = 0
        for index in range(self.cfg.num_seeds):
            seed_ctx = replace(self, seed_index=index)
            BACKENDS.get(self.cfg.backend.name).setup(self.cfg.backend, seed_ctx.seed)
            result = train_one(seed_ctx)
            steps, updates = steps + result.steps, updates + result.updates
            if self.cfg.checkpoint_every != 0 and index < self.cfg.num_seeds - 1:
                # The finished seed's files hold its whole run: resume= takes the metrics
                # from the last seed's file, which go on from there.
                seed_ctx.write_checkpoint(result.steps)
        return TrainResult(steps, updates)


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
