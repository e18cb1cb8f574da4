"""What every loop driven from Python does around its steps, and where it stands after its
last whole iteration (``ResumePoint``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np

from rlspeed.algos.loops.records import IntervalMetrics, log_seed
from rlspeed.checkpoint import capture, restore
from rlspeed.context import CheckpointSchedule, RunContext
from rlspeed.engines import Engine
from rlspeed.errors import deferred_interrupts


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
    interval = IntervalMetrics(partial(log_seed, ctx), cfg.log_every, cfg.total_steps)
    schedule = ctx.checkpoint_schedule()
    point = ResumePoint(schedule, learner=learner, **carried, interval=interval, engine=engine)
    ctx.set_checkpoint(checkpoint_name, learner.save, point.state)
    try:
        with deferred_interrupts() as check_interrupt:
            yield interval, point, check_interrupt
    finally:
        point.freeze()
        engine.close()


class ResumePoint:
    """Where a host-driven training loop stands after its last whole iteration: its env
    step and update counters, the latest observations and the state of its ``parts``
    (learner, replay buffer, interval metrics, engine: whatever the loop carries over).
    ``schedule`` writes the run's checkpoint when one is due at such a point."""

    def __init__(self, schedule: CheckpointSchedule | None = None, **parts: Any) -> None:
        self.schedule = schedule
        self.parts = parts
        self.step = self.updates = 0
        self.obs: Any = None
        self._frozen: dict[str, Any] | Exception | None = None

    def start(self, saved: dict[str, Any] | None, reset: Callable[[], Any]) -> tuple[Any, int, int]:
        """(observations, step, updates) to start the loop from: ``reset()``'s for a new
        run; for a resumed one the saved ones, with every part put back as it was."""
        self.obs = reset()  # also builds the engine state that the saved one replaces
        if saved is not None:
            for name, part in self.parts.items():
                restore(part, saved["parts"][name])
            self.obs, self.step, self.updates = saved["obs"], saved["step"], saved["updates"]
        if self.schedule is not None:
            self.schedule.start(self.step)
        return self.obs, self.step, self.updates

    def reached(self, step: int, updates: int, obs: Any) -> None:
        self.step, self.updates, self.obs = step, updates, obs
        if self.schedule is not None:
            self.schedule.reached(step)

    def freeze(self) -> None:
        """Take the parts' state now (before the engine closes, which drops its state). Where
        it cannot be taken (a gym-async worker that died), ``state()`` raises why: the run's
        other files are still written."""
        try:
            self._frozen = {name: capture(part) for name, part in self.parts.items()}
        except Exception as error:  # reported as the resume file's, by whoever saves it
            self._frozen = error

    def state(self) -> dict[str, Any]:
        if isinstance(self._frozen, Exception):
            raise self._frozen
        parts = self._frozen or {name: capture(part) for name, part in self.parts.items()}
        obs = np.asarray(self.obs)
        return {"step": self.step, "updates": self.updates, "obs": obs, "parts": parts}
