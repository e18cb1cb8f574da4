"""One seed of a host-driven run: its training as the config builds it (``seed_training``),
in the run's own process or in a seed worker process (``work``), which trains the seeds the
run hands it one after another and sends back each chunk's outcome for the run to record
(``rlspeed.seed_workers``), and the messages between the two.

A worker has no side effects of its own: it writes no file, logs to no tracker, takes no
signal (Ctrl-C and SIGTERM reach the run, which stops its workers at the end of their
iteration). It computes what the run's own process would for that seed, in the same order:
the seed's setup, engine, learner and ``HostTraining``, its evaluations where the run's
monitor will want a score (``seed_streams.evaluation_due``) and, for seed 0, the videos of
``video_every``."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import traceback
from contextlib import closing
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from rlspeed.checkpoint import why
from rlspeed.config import RunConfig
from rlspeed.core.algos import import_named
from rlspeed.core.algos.loops.host import (
    EpisodeBatch,
    HostChunk,
    HostTraining,
    ResumeMismatch,
    start_from,
)
from rlspeed.core.engines import EngineSpec
from rlspeed.core.tasks import TaskSpec
from rlspeed.errors import ConfigError, one_line
from rlspeed.registry import ALGOS, BACKENDS, ENGINES, TASKS
from rlspeed.seed_streams import evaluation_due, next_evaluation
from rlspeed.video import Film, film_or_why

if TYPE_CHECKING:
    from rlspeed.core import AgentCheckpoint

# What stops a run: its own process takes them; a worker ignores them.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR2}


def seed_training(
    cfg: RunConfig,
    task: TaskSpec,
    engine: EngineSpec,
    index: int,
    saved: dict[str, Any] | None,
    initial: AgentCheckpoint | None,
) -> HostTraining:
    """Agent ``index``'s training (seed ``cfg.seed + index``), from ``saved`` (its resume
    state) or from the start, its agent from ``initial`` (``init_from``) where given. The
    learner is built after its engine, so AsyncVectorEnv starts its workers before the
    backend starts threads of its own."""
    seed = cfg.seed + index
    BACKENDS.get(cfg.backend.name).setup(cfg.backend, seed)
    make_learner = import_named(ALGOS.get(cfg.algo.name).learners[cfg.backend.name])
    envs = engine.make(task, cfg.task, cfg.env, cfg.num_envs, seed)
    try:
        learner = make_learner(
            envs.single_observation_space, envs.single_action_space, cfg=cfg, seed=seed
        )
    except BaseException:
        envs.close()
        raise
    if initial is not None:
        start_from(learner, initial)
    # The run's checkpoint and video periods: each multiple ends a chunk (HostTraining).
    marks = [n for n in (cfg.checkpoint_every, cfg.video_every) if isinstance(n, int) and n > 0]
    return HostTraining(learner, envs, cfg.total_steps, cfg.log_every, saved, marks)


# ---------------------------------------------------------------- messages

# Run -> worker, besides ``Train``: hold at the end of the iteration in progress and send
# the seed's state (``Held``), then go on, or exit.
HOLD, GO, EXIT = "hold", "go", "exit"


class Train(NamedTuple):
    """Run -> worker: train agent ``seed`` from ``saved`` (its resume state, or None), its
    agent from ``initial`` (``init_from``); its next evaluation is at env step ``next_eval``
    (the run's monitor's, as resumed)."""

    seed: int
    saved: dict[str, Any] | None
    initial: AgentCheckpoint | None
    next_eval: int


class Started(NamedTuple):
    """Worker -> run, once its first agent's backend has started: the device it trains on."""

    device: str


class WorkerChunk(NamedTuple):
    """Worker -> run: a ``HostChunk`` of agent ``seed`` as it can travel: the greedy policy
    replaced by its ``score`` where an evaluation is due, and by its ``video`` (a film, or
    why none could be made) where seed 0 is to be filmed."""

    seed: int
    step: int
    updates: int
    episodes: list[EpisodeBatch]
    metrics: dict[str, float] | None
    score: float | None
    video: Film | str | None


class Held(NamedTuple):
    """Worker -> run, answering ``HOLD`` at the end of an iteration: agent ``seed``'s file
    and resume state as of the last chunk it sent (``seed`` None: it held with no agent)."""

    seed: int | None
    step: int
    agent: AgentCheckpoint | None
    # Or why it could not be taken (the run reports it as that file's).
    resume: dict[str, Any] | Exception | None


class Done(NamedTuple):
    """Worker -> run: agent ``seed`` trained to the end: its env steps and updates, its
    file and resume state."""

    seed: int
    steps: int
    updates: int
    agent: AgentCheckpoint
    resume: dict[str, Any] | Exception | None


class Failed(NamedTuple):
    """Worker -> run: agent ``seed`` failed with ``error`` (its traceback as ``trace``):
    in its training loop, in the iteration from env step ``at``, or as it was built (None)."""

    seed: int
    error: BaseException
    trace: str
    at: int | None


class Gone(BaseException):
    """The other end of a link has closed: the run ended (for a worker), or the worker did
    (for the run). Not an Exception: no ``except Exception`` around training takes it."""


class Exit(BaseException):
    """The run told its worker to exit."""


class Link:
    """One end of a pipe between the run and a worker, messages pickled as plain pickles
    (multiprocessing's own pickler would move torch tensors through shared memory)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, message: object) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, EOFError):
            raise Gone from None

    def receive(self) -> Any:
        try:
            return pickle.loads(self.conn.recv_bytes())
        except (OSError, EOFError):
            raise Gone from None

    def ready(self) -> bool:
        """Whether a message (or the end of the link) waits."""
        try:
            return self.conn.poll()
        except (OSError, EOFError):
            return True


# ---------------------------------------------------------------- the worker process


def work(conn: Connection, cfg: RunConfig, given: TaskSpec | None) -> None:
    """A seed worker process: train each agent the run hands it (``Train``) until told to
    exit or the run is gone. ``given``: the task given to ``rlspeed.train`` as a TaskSpec
    (else the registry's option ``cfg.task.name``)."""
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the run blocked them to start it
    # Workers share a GPU where there are fewer GPUs than workers: JAX allocates as it goes.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    worker = _Worker(Link(conn), cfg, given if given is not None else TASKS.get(cfg.task.name))
    with contextlib.suppress(Gone, Exit):
        while True:
            worker.obey(worker.link.receive(), None)


class _Worker:
    def __init__(self, link: Link, cfg: RunConfig, task: TaskSpec) -> None:
        self.link, self.cfg, self.task = link, cfg, task
        self.engine = ENGINES.get(cfg.env.name)
        self.started = False

    def obey(self, order: object, training: tuple[int, HostTraining] | None) -> None:
        """Carry out ``order`` from the run; ``training``: the agent in training, if any,
        standing at the end of an iteration the run has been sent."""
        if isinstance(order, Train):
            self.train(order)
        elif order == HOLD:
            held = Held(None, 0, None, None)
            if training is not None:
                index, agent = training
                resume = _resume_state(agent)
                held = Held(index, agent.step, agent.learner.agent_checkpoint(), resume)
            self.link.send(held)
            self.obey(self.link.receive(), None)  # GO or EXIT
        elif order == EXIT:
            raise Exit
        elif order != GO:
            raise RuntimeError(f"a seed worker got {order!r} from the run")

    def train(self, order: Train) -> None:
        cfg, index = self.cfg, order.seed
        training: HostTraining | None = None
        try:
            training = seed_training(cfg, self.task, self.engine, index, order.saved, order.initial)
            if not self.started:
                self.started = True
                self.link.send(Started(BACKENDS.get(cfg.backend.name).device_name(cfg.backend)))
            clock = _Clocks(cfg, index, training.step, order.next_eval)
            with closing(training.chunks()) as chunks:
                for chunk in chunks:
                    self.link.send(self.outcome(index, chunk, clock))
                    training.accept()
                    if self.link.ready():
                        self.obey(self.link.receive(), (index, training))
            agent = training.learner.agent_checkpoint()
            resume = _resume_state(training)
            self.link.send(Done(index, training.step, training.updates, agent, resume))
        except ResumeMismatch as error:
            allowed = f"a resume file whose state this run can take ({why(error.args[0])})"
            self.fail(index, ConfigError("resume", cfg.resume, allowed), training)
        except Exception as error:  # noqa: BLE001 - the run's process says it, as it would
            self.fail(index, error, training)

    def outcome(self, index: int, chunk: HostChunk, clock: _Clocks) -> WorkerChunk:
        """``chunk`` as it travels, with the score and video the run will want of it."""
        cfg, score, video = self.cfg, None, None
        logged = chunk.metrics is not None
        if logged and evaluation_due(chunk.step, clock.next_eval, cfg.total_steps):
            score = float(self.task.evaluate(cfg.task, chunk.greedy, cfg.seed + index))
            clock.next_eval = int(next_evaluation(chunk.step, clock.next_eval, cfg.eval_every))
        if clock.video_due(chunk.step):
            video = film_or_why(self.task, cfg.task, chunk.greedy, cfg.seed)
        episodes = [EpisodeBatch(*(np.asarray(a) for a in batch)) for batch in chunk.episodes]
        return WorkerChunk(index, chunk.step, chunk.updates, episodes, chunk.metrics, score, video)

    def fail(self, index: int, error: Exception, training: HostTraining | None) -> None:
        """Send the run why agent ``index`` failed, then end: the run ends with it."""
        trace = "".join(traceback.format_exception(error))
        at = None if training is None else training.step
        self.link.send(Failed(index, _portable(error), trace, at))
        raise Exit


def _resume_state(training: HostTraining) -> dict[str, Any] | Exception | None:
    """What resume= continues agent ``training`` from, or why it cannot be taken (a
    gym-async worker that died): the run's other files are written, this one's error said."""
    try:
        return training.resume_state()
    except Exception as error:  # noqa: BLE001 - reported as the resume file's, by the run
        return _portable(error)


def _portable(error: Exception) -> Exception:
    """``error``, or, where it cannot be pickled, a RuntimeError of its line."""
    try:
        pickle.dumps(error)
    except Exception:  # noqa: BLE001 - an exception that cannot travel travels as its line
        return RuntimeError(one_line(error))
    return error


class _Clocks:
    """A seed's next evaluation, as the run's monitor counts it, and (seed 0) its next video."""

    def __init__(self, cfg: RunConfig, index: int, start: int, next_eval: int) -> None:
        self.next_eval = next_eval
        self.video_every = cfg.video_every if index == 0 else 0
        self.video_block = start // self.video_every if self.video_every else 0

    def video_due(self, step: int) -> bool:
        """``VideoSchedule.due``: the first iteration to reach each multiple of video_every."""
        if not self.video_every or step // self.video_every <= self.video_block:
            return False
        self.video_block = step // self.video_every
        return True
