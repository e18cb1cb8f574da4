"""Runs as SLURM jobs: preemption, requeue, and the requeued job continuing the run.

SLURM warns a job before it ends it: SIGUSR2 ahead of its time limit or a preemption
(``hydra/launcher=submitit_slurm`` asks for it ``signal_delay_s`` seconds ahead; ``scancel
--signal=USR2`` sends it by hand) and SIGTERM when it preempts or cancels it. Either stops
training like Ctrl-C: the run saves its checkpoint and resume state in its output folder and
ends KILLED, in MLflow too. After SIGUSR2 the job is requeued: by submitit, which requeues
the same Hydra job (so the same output folder), or by ``scontrol requeue`` for a plain
``sbatch`` of rlspeed. After SIGTERM, a job SLURM chose for preemption (``PreemptTime`` in
``scontrol show job``; PreemptMode=REQUEUE) is requeued with ``scontrol requeue``: ended
within its partition's GraceTime, SLURM would mark it FAILED instead. A cancelled job stays
cancelled.

A requeued job (``SLURM_RESTART_COUNT`` > 0) whose output folder holds an earlier attempt's
resume state continues from it: the same folder, the same MLflow run, the same Optuna trial.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from rlspeed.checkpoint import resume_files

log = logging.getLogger("rlspeed")


def job_id() -> str | None:
    """This process's SLURM job (``<array job>_<task>`` in a job array), None outside SLURM."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array is not None:
        return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def restarts() -> int:
    """How many times SLURM has requeued this job."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def continued_folder(out_dir: Path) -> Path | None:
    """``out_dir`` when this is a requeued SLURM job and an earlier attempt of it left its
    resume state there (the run then continues from it), else None."""
    if job_id() is None or restarts() == 0:
        return None
    return out_dir if resume_files(out_dir) else None


class StopSignals:
    """``with StopSignals(handler):`` routes SIGTERM, and SIGUSR2 inside a SLURM job, to
    ``handler`` (which stops the run like Ctrl-C, raising a KeyboardInterrupt that carries
    ``signum``); on leaving on such a SIGUSR2, after the run has saved itself, the job is
    requeued and the process exits. Only the main thread can set signal handlers: elsewhere
    this does nothing."""

    def __init__(self, handler: Callable[[int, Any], None]) -> None:
        self.handler = handler
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            signums = [signal.SIGTERM] + ([signal.SIGUSR2] if job_id() is not None else [])
            self.previous = {signum: signal.signal(signum, self.handler) for signum in signums}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        stopped_by, out_dir = getattr(error, "signum", None), getattr(error, "out_dir", None)
        requeued = None
        if stopped_by == signal.SIGUSR2 and signal.SIGUSR2 in self.previous:
            requeued = _requeue(self.previous[signal.SIGUSR2], out_dir)
        elif stopped_by == signal.SIGTERM and job_id() is not None and _preempted():
            # Preempted with a grace time: a job that ends before it would not be requeued.
            requeued = _requeue(None, out_dir)
        if requeued is not None:
            error.requeued = requeued  # type: ignore[union-attr]  # for the exit line


def _preempted() -> bool:
    """Whether SLURM has chosen this job for preemption (its SIGTERM is then no cancel)."""
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", job_id() or ""],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"\bPreemptTime=(?!None\b)\S", shown) is not None


def _requeue(submitit_handler: Any, out_dir: Path | None) -> bool:
    """Requeue this job; True if it is (submitit's handler exits the process itself)."""
    job = job_id()
    assert job is not None  # called in a SLURM job only (StopSignals)
    log.warning("rlspeed: SLURM job %s: the run is saved in %s; requeueing the job", job, out_dir)
    # A requeue ends this attempt with SIGTERM: the run is saved already, so it is ignored.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if callable(submitit_handler):
        # submitit's: it records the job to rerun (the same Hydra job), requeues and exits.
        submitit_handler(signal.SIGUSR2, None)
        return False  # not requeued: submitit's handler raised without exiting
    try:
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("rlspeed: could not requeue SLURM job %s (%s)", job, error)
        return False
    return True
