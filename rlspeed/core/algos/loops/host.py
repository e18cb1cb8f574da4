"""The training loop driven from Python (every pairing but flax + jax-vmap), as chunks.

The algorithm's learner says what an iteration does (``HostLearner.iteration``);
``HostTraining.chunks()`` runs the iterations and yields one ``HostChunk`` after each chunk
of them (``HostTraining.ends_chunk``): the env steps and updates so far, the episodes that
ended, the interval's metrics when a log is due, the greedy policy. Nothing here records,
evaluates, checkpoints or waits for signals: the run (``rlspeed.run``) does, between chunks,
and says with ``accept()`` that a chunk's state is what the run keeps (what ``resume=``
continues from)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from rlspeed.core.engines import Engine
from rlspeed.core.state import capture, load_weights, restore
from rlspeed.core.tasks import Policy
from rlspeed.errors import EnvFailed

if TYPE_CHECKING:
    from rlspeed.core import AgentCheckpoint, XpArray


class EpisodeSink(Protocol):
    """Where an iteration hands the episodes that ended in it."""

    def episodes(self, done: XpArray, episode_return: XpArray, episode_length: XpArray) -> None:
        """Episodes that ended: arrays of any shape (NumPy, or JAX as the engine gives
        them), ``done`` as their mask."""


class EpisodeBatch(NamedTuple):
    done: Any
    episode_return: Any
    episode_length: Any


class EndedEpisodes:
    """The episodes an iteration hands over (an ``EpisodeSink``), until the chunk takes them."""

    def __init__(self) -> None:
        self.batches: list[EpisodeBatch] = []

    def episodes(self, done: XpArray, episode_return: XpArray, episode_length: XpArray) -> None:
        self.batches.append(EpisodeBatch(done, episode_return, episode_length))

    def take(self) -> list[EpisodeBatch]:
        batches, self.batches = self.batches, []
        return batches


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
    """An algorithm's learner as ``HostTraining`` drives it: its file says, top to bottom,
    how an iteration collects, computes its targets and updates.

    Optional, besides: ``carried``, a dict of the parts besides the learner that a resume
    continues from (a replay buffer), and ``observe(obs)``, which turns the envs'
    observations into what the learner carries between iterations as ``obs`` where that is
    something else (Q-learning: their state indices)."""

    def iteration(
        self, engine: Engine, obs: XpArray, step: int, episodes: EpisodeSink
    ) -> Iteration:
        """One iteration from env step ``step``: act on ``obs`` (the engine's observations,
        or what ``observe`` made of them) and step ``engine`` (handing finished episodes to
        ``episodes``), store, learn."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions as NumPy, for evaluation."""

    def agent_checkpoint(self) -> AgentCheckpoint:
        """What the agent's checkpoint file holds (the run writes it)."""


def start_from(learner: HostLearner, saved: AgentCheckpoint) -> None:
    """``init_from=``: a new learner's agent takes ``saved``, the weights of an agent file
    (``core.state.weights``); its optimizers, counters and generators stay as built. A torch
    learner's ``agent_checkpoint()`` holds its networks' own tensors, which take the weights
    in place; a learner whose arrays cannot be written so (JAX's) has ``start_from(saved)``."""
    own: Callable[[AgentCheckpoint], None] | None = getattr(learner, "start_from", None)
    if own is not None:
        own(saved)
    else:
        load_weights(learner.agent_checkpoint(), saved)


# A chunk's iterations at most, and its seconds (after which it ends with the iteration in
# progress): what the run does between chunks (record, checkpoint, answer Ctrl-C, move the
# bar) waits at most about so long.
CHUNK_ITERATIONS = 64
CHUNK_SECONDS = 0.1


class HostChunk(NamedTuple):
    """A chunk of iterations' outcome, as the run records it."""

    # Env steps and updates of this agent so far (the chunk's end).
    step: int
    updates: int
    episodes: list[EpisodeBatch]
    # The log interval's means, with the iteration's latest values, when a log is due.
    metrics: dict[str, float] | None
    greedy: Policy


class IntervalMetrics:
    """A host loop's metrics between two logs. Values stay backend scalars as they come
    (no host sync per update) and are averaged once ``log_every`` env steps have passed,
    or at the last step."""

    def __init__(self, log_every: int, total_steps: int) -> None:
        self.log_every = log_every
        self.total_steps = total_steps
        self.next_log = log_every
        self.values: dict[str, list[Any]] = {}

    def add(self, metrics: dict[str, Any]) -> None:
        for name, value in metrics.items():
            self.values.setdefault(name, []).append(value)

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_log": self.next_log,
            "values": {name: [float(v) for v in vs] for name, vs in self.values.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_log = state["next_log"]
        self.values = {name: list(vs) for name, vs in state["values"].items()}

    def due(self, step: int, latest: dict[str, float] | None = None) -> dict[str, float] | None:
        """The interval's means, and ``latest`` (values as of now, e.g. schedules), when a log
        is due at env step ``step`` (the interval then starts again); else None."""
        if step < self.next_log and step < self.total_steps:
            return None
        metrics = dict(latest or {})
        metrics.update(
            {name: float(np.mean([float(v) for v in vs])) for name, vs in self.values.items()}
        )
        self.values = {}
        while self.next_log <= step:
            self.next_log += self.log_every
        return metrics


class ResumeMismatch(Exception):
    """A saved state this run's parts cannot take (arrays of other shapes: an earlier
    rlspeed's replay buffer, say); the message says what."""


class HostTraining:
    """One agent trained from Python: ``learner``'s iterations on ``engine`` until
    ``total_steps``, from ``saved`` (a state ``resume_state`` gave) or from a reset. The
    parts a resume continues from are the learner, its ``carried`` parts, the interval
    metrics and the engine."""

    def __init__(
        self,
        learner: HostLearner,
        engine: Engine,
        total_steps: int,
        log_every: int,
        saved: dict[str, Any] | None = None,
        marks: Sequence[int] = (),
    ) -> None:
        self.learner, self.engine, self.total_steps = learner, engine, total_steps
        self.saved = saved
        # Periods whose multiples end a chunk: the run's checkpoints' and videos', taken at
        # the first whole iteration that reaches each.
        self.marks = tuple(marks)
        self.interval = IntervalMetrics(log_every, total_steps)
        carried: dict[str, Any] = getattr(learner, "carried", {})
        self.point = ResumePoint(learner=learner, **carried, interval=self.interval, engine=engine)
        # Env step and updates the current (or last) iteration started from.
        self.step = saved["step"] if saved is not None else 0
        self.updates = 0
        self._obs: Any = None

    @property
    def whole(self) -> bool:
        """Whether the agent stands at the end of an accepted iteration."""
        return self.point.whole

    def chunks(self) -> Generator[HostChunk, None, None]:
        """Train, yielding after each chunk of iterations (``ends_chunk``). Raises
        ``ResumeMismatch`` for a saved state the parts cannot take, ``EnvFailed`` for an
        env's code that failed. However it ends, the parts' state is taken
        (``resume_state``) before the engine closes."""
        observe = getattr(self.learner, "observe", None)
        engine = self.engine
        reset = engine.reset if observe is None else lambda: observe(engine.reset())
        episodes = EndedEpisodes()
        trained = False
        try:
            obs, self.step, self.updates = self.point.start(self.saved, reset)
            while self.step < self.total_steps:
                self.point.whole = False  # until the run accepts the chunk
                started, due = time.perf_counter(), None
                for iterations in itertools.count(1):
                    done = self.learner.iteration(engine, obs, self.step, episodes)
                    obs, before = done.obs, self.step
                    for metrics in done.metrics:
                        self.interval.add(metrics)
                    self.step, self.updates = before + done.steps, self.updates + done.updates
                    due = self.interval.due(self.step, done.latest)
                    if self.ends_chunk(before, due, iterations, started):
                        break
                self._obs = obs
                yield HostChunk(self.step, self.updates, episodes.take(), due, self.learner.greedy)
            trained = True
        finally:
            # The parts' state is taken before the engine closes, which drops the envs' state.
            self.point.freeze()
            try:
                engine.close()
            except EnvFailed:
                if trained:  # else what stopped the training is on its way already
                    raise

    def ends_chunk(
        self, before: int, due: dict[str, float] | None, iterations: int, started: float
    ) -> bool:
        """Whether the chunk ends with the iteration from env step ``before`` to
        ``self.step``: where a log is due (``due``), training ends, the step reaches a
        multiple of one of ``marks``, or the chunk has run ``CHUNK_ITERATIONS`` iterations
        or ``CHUNK_SECONDS``. A run of one env makes an iteration of a step: recording each
        cost it as much as its replay writes and exploration together."""
        return (
            due is not None
            or self.step >= self.total_steps
            or any(self.step // mark > before // mark for mark in self.marks)
            or iterations >= CHUNK_ITERATIONS
            or time.perf_counter() - started >= CHUNK_SECONDS
        )

    def accept(self) -> None:
        """The run has recorded the last chunk: the agent's state at its end is what the
        run keeps."""
        self.point.reached(self.step, self.updates, self._obs)

    def resume_state(self) -> dict[str, Any] | None:
        """What ``resume=`` continues from; None where training stopped inside an iteration
        the run did not accept."""
        return self.point.state()


class ResumePoint:
    """Where a host-driven training loop stands after its last whole iteration: its env
    step and update counters, the latest observations and the state of its ``parts``
    (learner, replay buffer, interval metrics, engine: whatever the loop carries over)."""

    # ``parts``: anything; ``capture`` and ``restore`` refuse a part without a state_dict().
    def __init__(self, **parts: object) -> None:
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
            try:
                for name, part in self.parts.items():
                    restore(part, saved["parts"][name])
            except (KeyError, TypeError, ValueError) as error:
                raise ResumeMismatch(error) from None
            self.obs, self.step, self.updates = saved["obs"], saved["step"], saved["updates"]
        return self.obs, self.step, self.updates

    def reached(self, step: int, updates: int, obs: XpArray) -> None:
        """The loop is at the end of a whole iteration: what resume= can continue from."""
        self.step, self.updates, self.obs, self.whole = step, updates, obs, True

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
