"""The training loop driven from Python (every pairing but flax + jax-vmap): the algorithm's
learner says what an iteration does (``HostLearner.iteration``); ``train_host`` runs the
iterations with what every run needs around them: log intervals, the resume point after each
whole iteration, checkpoints, interrupts held to the iteration's end."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from rlspeed.algos.loops.records import IntervalMetrics, log_seed
from rlspeed.checkpoint import capture, restore, why
from rlspeed.context import CheckpointSchedule, RunContext, TrainResult
from rlspeed.engines import Engine
from rlspeed.errors import ConfigError, EnvFailed, RLSpeedError, deferred_interrupts
from rlspeed.monitor import SeedMonitor, to_log_file


class Iteration(NamedTuple):
    """What one iteration of an algorithm's host-driven training did."""

    # The envs' latest observations, what the next iteration acts on.
    obs: Any
    # Env steps it took (over every env) and gradient updates it made.
    steps: int
    updates: int
    # Each update's metrics as backend scalars (no host sync): averaged per log interval.
    metrics: list[dict[str, Any]]
    # Values as of now (schedules such as epsilon), logged as they are.
    latest: dict[str, float] | None = None


class HostLearner(Protocol):
    """An algorithm's learner as ``train_host`` drives it: its file says, top to bottom,
    how an iteration collects, computes its targets and updates.

    Optional, besides: ``carried``, a dict of the parts besides the learner that a resume
    continues from (a replay buffer), and ``observe(obs)``, which turns the envs'
    observations into what the learner carries between iterations as ``obs`` where that is
    something else (Q-learning: their state indices)."""

    def iteration(self, engine: Engine, obs: Any, step: int, episodes: SeedMonitor) -> Iteration:
        """One iteration from env step ``step``: act on ``obs`` and step ``engine`` (handing
        finished episodes to ``episodes``), store, learn."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions as NumPy, for evaluation."""

    def save(self, path: Path) -> Path:
        """Write the agent's checkpoint file."""


def train_host(
    ctx: RunContext, make_learner: Callable[[Any, Any], HostLearner], checkpoint_name: str
) -> TrainResult:
    """Train one agent from Python: ``make_learner(observation_space, action_space)``'s
    iterations until ``total_steps``, with logs, resume points, checkpoints and interrupts
    around them. A learner's ``carried`` (a dict, optional) names the parts besides itself
    that a resume continues from (a replay buffer); its ``observe`` (optional) turns the
    reset's observations into what it carries between iterations."""
    cfg = ctx.cfg
    engine = ctx.make_engine()
    learner = make_learner(engine.single_observation_space, engine.single_action_space)
    interval = IntervalMetrics(partial(log_seed, ctx), cfg.log_every, cfg.total_steps)
    carried = getattr(learner, "carried", {})
    point = ResumePoint(
        ctx.checkpoint_schedule(), learner=learner, **carried, interval=interval, engine=engine
    )
    ctx.set_checkpoint(checkpoint_name, learner.save, point.state)
    observe = getattr(learner, "observe", None)
    reset = engine.reset if observe is None else lambda: observe(engine.reset())
    step = updates = 0
    trained = False
    try:
        with deferred_interrupts() as check_interrupt:
            obs, step, updates = _start(point, ctx, reset)
            while step < cfg.total_steps:
                point.whole = False  # until the iteration has been taken to its end
                done = learner.iteration(engine, obs, step, ctx.monitor)
                obs, step, updates = done.obs, step + done.steps, updates + done.updates
                for metrics in done.metrics:
                    interval.add(metrics)
                interval.log_if_due(step, updates, learner.greedy, done.latest)
                point.reached(step, updates, obs)
                ctx.monitor.moved(step)
                check_interrupt()
        trained = True
    except EnvFailed as failed:
        raise _env_failure(ctx, failed, step, point) from None
    finally:
        # The parts' state is taken before the engine closes, which drops the envs' state.
        point.freeze()
        try:
            engine.close()
        except EnvFailed as failed:
            if trained:  # else what stopped the run is said already
                raise _env_failure(ctx, failed, step, point) from None
    return TrainResult(steps=step, updates=updates)


def _start(point: ResumePoint, ctx: RunContext, reset: Callable[[], Any]) -> tuple[Any, int, int]:
    """``point.start``; a resume file whose state this run's parts cannot take (its arrays
    of other shapes: an earlier rlspeed's replay buffer, say) is one line."""
    try:
        return point.start(ctx.resume_state(), reset)
    except (KeyError, TypeError, ValueError) as error:
        allowed = f"a resume file whose state this run can take ({why(error)})"
        raise ConfigError("resume", ctx.cfg.resume, allowed) from None


def _env_failure(ctx: RunContext, failed: EnvFailed, step: int, point: ResumePoint) -> RLSpeedError:
    """The run's one line for an env whose code failed in the iteration from ``step``: it,
    what it said, and where the run can resume from; its traceback goes to the log file."""
    to_log_file(failed.trace)
    written = point.schedule.written if point.schedule is not None else None
    where = f"in the iteration from env step {step:,}"
    if failed.call == "close" and point.whole:  # as the loop ended: its state was taken
        where, resume = f"at env step {step:,}", "the run's files are written as of that step"
    elif written is not None:
        resume = f"resume={ctx.out_dir} continues from env step {written:,}, its last resume point"
    elif ctx.cfg.resume:
        resume = f"resume={ctx.cfg.resume} continues from where this run started"
    else:
        resume = "no resume point was written before it (checkpoint_every sets how often)"
    return RLSpeedError(
        f"rlspeed: env {failed.env} failed in its {failed.call} ({where}): {failed.said}; {resume}"
    )


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
        # False while the loop is inside an iteration: a run that stops there (an env that
        # failed) has no state to resume from but the last one written.
        self.whole = True
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
        """The loop is at the end of a whole iteration: what resume= can continue from."""
        self.step, self.updates, self.obs, self.whole = step, updates, obs, True
        if self.schedule is not None:
            self.schedule.reached(step)

    def freeze(self) -> None:
        """Take the parts' state now (before the engine closes, which drops its state), if
        the loop stopped at the end of a whole iteration. Where it cannot be taken (a
        gym-async worker that died), ``state()`` raises why: the run's other files are still
        written."""
        if not self.whole:
            return
        try:
            self._frozen = {name: capture(part) for name, part in self.parts.items()}
        except Exception as error:  # reported as the resume file's, by whoever saves it
            self._frozen = error

    def state(self) -> dict[str, Any] | None:
        """What resume= continues from; None where the loop stopped inside an iteration
        (the resume file written last, if any, stays)."""
        if not self.whole:
            return None
        if isinstance(self._frozen, Exception):
            raise self._frozen
        parts = self._frozen or {name: capture(part) for name, part in self.parts.items()}
        obs = np.asarray(self.obs)
        return {"step": self.step, "updates": self.updates, "obs": obs, "parts": parts}
