"""What every loop driven from Python does around its steps."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rlspeed.checkpoint import ResumePoint, deferred_interrupts
from rlspeed.engines import Engine
from rlspeed.monitor import IntervalMetrics
from rlspeed.run import RunContext


@contextlib.contextmanager
def host_training(
    ctx: RunContext, engine: Engine, learner: Any, checkpoint_name: str, **carried: Any
) -> Iterator[tuple[IntervalMetrics, ResumePoint, Callable[[], None]]]:
    """The loop's log intervals, its resume point (the learner, the engine, the intervals and
    what else ``carried`` names, e.g. a replay buffer), the learner's checkpoint (written at
    the end, and by the resume point as ``checkpoint_every`` says), and interrupts held to
    the end of an iteration (the third value checks for one). The engine
    is closed however the loop ends, once the resume point has taken its state."""
    cfg = ctx.cfg
    interval = IntervalMetrics(ctx.monitor, cfg.log_every, cfg.total_steps)
    schedule = ctx.checkpoint_schedule()
    point = ResumePoint(schedule, learner=learner, **carried, interval=interval, engine=engine)
    ctx.set_checkpoint(checkpoint_name, learner.save, point.state)
    try:
        with deferred_interrupts() as check_interrupt:
            yield interval, point, check_interrupt
    finally:
        point.freeze()
        engine.close()
