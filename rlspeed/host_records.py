"""How the run records what its training loops yield, whichever process trained it: a
host-driven seed's chunk (``record_chunk``: its episodes, its metrics, checked finite, its
score, handed to the Optuna trial), where it trains (``trains_on``) and, in one line, an env
that failed (``env_failure``). The run's one process with side effects calls these: for
seeds trained one after another in it (``rlspeed.run``) and for seeds trained in worker
processes (``rlspeed.seed_workers``) alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rlspeed.core.algos.loops.host import EpisodeBatch
from rlspeed.errors import DivergenceError, EnvFailed, RLSpeedError
from rlspeed.monitor import Evaluated, to_log_file
from rlspeed.recording import Run


class Chunk(Protocol):
    """What ``record_chunk`` reads of a chunk: a ``HostChunk``, or a seed worker's."""

    @property
    def step(self) -> int: ...
    @property
    def updates(self) -> int: ...
    @property
    def episodes(self) -> Sequence[EpisodeBatch]: ...
    @property
    def metrics(self) -> dict[str, float] | None: ...


def record_chunk(run: Run, index: int, chunk: Chunk, score: Callable[[], float]) -> None:
    """Record agent ``index``'s chunk: its finished episodes, and its metrics where a log is
    due, with ``score()`` as its score where an evaluation is due too."""
    monitor = run.monitor
    for batch in chunk.episodes:
        monitor.episodes(*batch, seed=index)
    if chunk.metrics is not None:
        check_finite(chunk.metrics, [index], [chunk.step], run.cfg.num_seeds)
        report(run, monitor.log_scored(chunk.step, chunk.updates, chunk.metrics, score, index))


def trains_on(run: Run, devices: list[str]) -> None:
    """The run trains on ``devices``: its summary, metrics.json and tracked run say so."""
    run.devices = devices
    run.tracker.set_tags({"rlspeed.devices": ", ".join(devices)})


def check_finite(metrics: dict[str, Any], seeds: Any, steps: Any, num_seeds: int) -> None:
    """Raise DivergenceError at the first loss (``losses/...``) that is not finite; a metric
    is a value per seed of ``seeds`` (an array), or one number where one seed logs."""
    for name, value in metrics.items():
        if not name.startswith("losses/"):
            continue
        values = np.atleast_1d(value)
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            seed = int(seeds[bad[0]])
            raise DivergenceError(
                f"rlspeed: training diverged: {name}={values[bad[0]]} at step "
                f"{steps[bad[0]]}"
                + (f" (seed {seed})" if num_seeds > 1 else "")
                + "; lower the algorithm's learning rate or check the task's rewards"
            )


def report(run: Run, evaluated: Evaluated | None) -> None:
    """Hand a new score to the run's trial, if it is one: its pruner may stop the run
    (``optuna.TrialPruned``)."""
    if evaluated is not None and run.reporter is not None:
        run.reporter.report(evaluated.score, evaluated.step)


def env_failure(
    run: Run, failed: EnvFailed, step: int, whole: bool, written: int | None
) -> RLSpeedError:
    """The run's one line for an env whose code failed in the iteration from ``step``: it,
    what it said, and where the run can resume from (``written``: the env step of the seed's
    last resume point written while it trained); its traceback goes to the log file."""
    to_log_file(failed.trace)
    where = f"in the iteration from env step {step:,}"
    if failed.call == "close" and whole:  # as the loop ended: its state was taken
        where, resume = f"at env step {step:,}", "the run's files are written as of that step"
    else:
        resume = resume_point(run, written)
    return RLSpeedError(
        f"rlspeed: env {failed.env} failed in its {failed.call} ({where}): {failed.said}; {resume}"
    )


def resume_point(run: Run, written: int | None) -> str:
    """Where a run that failed can resume from: ``written``, the env step of the failed
    seed's last resume point written while it trained, else where the run itself started."""
    if written is not None:
        return f"resume={run.out_dir} continues from env step {written:,}, its last resume point"
    if run.cfg.resume:
        return f"resume={run.cfg.resume} continues from where this run started"
    return "no resume point was written before it (checkpoint_every sets how often)"
