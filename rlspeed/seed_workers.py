"""``backend.seed_workers`` > 1: a host-driven run's seeds train in worker processes at once
(``rlspeed.seed_training.work``, started with 'spawn': torch's and XLA's threads do not
survive a fork), each worker its seeds one after another, and the run's process records what
they send as it records seeds it trains itself (``rlspeed.host_records``): each seed's rows
are the same either way.

The run's process is the one with side effects (tracker, monitor, progress, files), and its
files agree with its monitor: while the run trains, every seed's files are written together
(``_write_together``), its workers held at the end of an iteration, each seed's rows in the
monitor exactly those up to the state written, so that resume= continues every seed exactly.
Ctrl-C and SIGTERM reach the run alone: it stops every worker at the end of its iteration,
takes their state and ends KILLED, as a run in one process does. A worker whose env fails is
the run's one line for it, one that dies is one line naming its seed and exit code; however
the run ends, its workers end with it. Where the run ends otherwise (a failure, a second
Ctrl-C), the resume files stay as written last, all of one moment."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from rlspeed.config import RunConfig
from rlspeed.core.algos.loops import CHECKPOINT_FILES, TrainResult
from rlspeed.errors import EnvFailed, RLSpeedError, deferred_interrupts
from rlspeed.host_records import env_failure, record_chunk, resume_point, trains_on
from rlspeed.monitor import to_log_file
from rlspeed.recording import AUTO_PERIOD_S, AUTO_WRITE_RATIO, Run, set_agent_files, write_now
from rlspeed.registry import BACKENDS, TASKS
from rlspeed.seed_training import (
    EXIT,
    GO,
    HOLD,
    STOP_SIGNALS,
    Done,
    Failed,
    Gone,
    Held,
    Link,
    Started,
    Train,
    WorkerChunk,
    work,
)

log = logging.getLogger("rlspeed")

# Seconds between looks at a held signal while the run waits for its workers.
WAIT_S = 0.2
# Seconds workers told to exit may take to end (their iteration, closing their envs) before
# they are killed.
EXIT_S = 10.0


@dataclass(eq=False)  # each worker is itself (a dict key)
class _Worker:
    number: int
    process: BaseProcess
    link: Link
    # The agent it trains (None: none yet, or it finished one) and that agent's last env
    # step recorded.
    index: int | None = None
    step: int = 0
    # Whether it answered the last HOLD; whether it was told to exit (or died); whether its
    # process has ended.
    held: bool = False
    leaving: bool = False
    ended: bool = False
    # Whether it has started its backend (``Started``).
    started: bool = False


class SeedWorkers:
    """A run's seeds trained in ``count`` worker processes, recorded in this one."""

    def __init__(self, run: Run, count: int) -> None:
        self.run, self.count = run, count
        cfg = run.cfg
        self.todo = deque(range(cfg.num_seeds))
        self.workers: list[_Worker] = []
        # Per agent, the latest state a worker sent: its file, what resume= continues from.
        self.agents: dict[int, Any] = {}
        self.resumes: dict[int, Any] = {}
        # Agents that finished (their env steps and updates), those not written since.
        self.finished: dict[int, tuple[int, int]] = {}
        self.unwritten: set[int] = set()
        # Per agent, the env step of its resume point written last while it trained.
        self.written: dict[int, int] = {}
        # False once the run ended without every worker's state (a failure): the resume
        # files then stay as written last, of one moment, rather than of two.
        self.consistent = True
        self.devices: list[str] = []
        self.schedule = TogetherSchedule(cfg.checkpoint_every, cfg.total_steps)
        self.collecting = False

    def train(self) -> TrainResult:
        """Train every seed; returns their env steps and updates summed."""
        stopped = False
        try:
            with deferred_interrupts() as check_interrupt:
                self._start()
                while self.todo or any(w.index is not None for w in self.workers):
                    self._receive()
                    try:
                        check_interrupt()
                    except KeyboardInterrupt:  # held to here: every chunk sent is recorded
                        stopped = self._stop()
                        raise
        except BaseException:  # a second Ctrl-C lands anywhere: out at once, as alone
            if not stopped and len(self.finished) < self.run.cfg.num_seeds:
                self.consistent = False
            raise
        finally:
            self._close()
        done = [self.finished[index] for index in sorted(self.finished)]
        return TrainResult(sum(s for s, _ in done), sum(u for _, u in done))

    # ------------------------------------------------------------ workers' lives

    def _start(self) -> None:
        cfg = self.run.cfg
        spawn = multiprocessing.get_context("spawn")
        given = TASKS.given(cfg.task.name)
        gpus = BACKENDS.get(cfg.backend.name).worker_gpus(cfg.backend)
        for number in range(min(self.count, cfg.num_seeds)):
            ours, theirs = spawn.Pipe()
            process = spawn.Process(
                target=work,
                args=(theirs, _worker_config(cfg, number, gpus), given),
                name=f"rlspeed-seed-worker-{number}",
            )
            with _stop_signals_blocked():  # until the worker ignores them (Ctrl-C is the run's)
                process.start()
            theirs.close()
            worker = _Worker(number, process, Link(ours))
            self.workers.append(worker)
            self._assign(worker)

    def _assign(self, worker: _Worker) -> None:
        """Hand ``worker`` the next agent to train, or tell it to exit."""
        run = self.run
        if not self.todo:
            worker.leaving = True  # its seeds are in: its end is no failure, however it comes
            self._send(worker, EXIT)
            return
        index = self.todo.popleft()
        saved = run.resumed.get(index)
        if saved is not None:  # the run's monitor holds the rest
            saved = {key: value for key, value in saved.items() if key != "monitor"}
        worker.index, worker.step = index, saved["step"] if saved is not None else 0
        self.schedule.start(index, worker.step)
        if index == 0 and run.videos is not None:
            run.videos.start(worker.step)
        next_eval = int(run.monitor.streams.next_eval[index])
        self._send(worker, Train(index, saved, run.initial, next_eval))

    def _send(self, worker: _Worker, message: object) -> None:
        try:
            worker.link.send(message)
            return
        except Gone:
            pass
        self._ended(worker)  # outside the except: its line is the whole story

    def _receive(self) -> None:
        """Record what the workers have sent, waiting up to ``WAIT_S`` for something."""
        live = [w for w in self.workers if not w.ended]
        waited: dict[Any, _Worker] = {w.link.conn: w for w in live}
        waited |= {w.process.sentinel: w for w in live}
        for worker in dict.fromkeys(waited[ready] for ready in wait(list(waited), WAIT_S)):
            self._drain(worker)

    def _drain(self, worker: _Worker) -> None:
        while worker.link.ready():
            try:
                message = worker.link.receive()
            except Gone:
                break
            self._handle(worker, message)
        else:
            if worker.process.exitcode is None:
                return
        self._ended(worker)

    def _ended(self, worker: _Worker) -> None:
        """``worker``'s process has ended: as told, or it died (the run's one line)."""
        worker.process.join(EXIT_S)
        if worker.process.is_alive():  # its end of the link closed, yet it runs on
            worker.process.kill()
            worker.process.join()
        worker.ended = True
        if worker.leaving:
            return
        worker.leaving = True
        code = worker.process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how += f" (killed by {signal.Signals(-code).name})"
        if not worker.started:  # its own output says why (a script without the guard?)
            raise RLSpeedError(
                f"rlspeed: seed worker {worker.number} ended with {how} as it started; from "
                "Python, a script that trains with backend.seed_workers needs the "
                "'if __name__ == \"__main__\":' guard (the workers import it)"
            )
        if worker.index is None:
            raise RLSpeedError(f"rlspeed: seed worker {worker.number} ended with {how}")
        resume = resume_point(self.run, self.written.get(worker.index))
        raise RLSpeedError(
            f"rlspeed: the worker process training seed {worker.index} ended with {how} in "
            f"the iteration from env step {worker.step:,}; {resume}"
        )

    def _close(self) -> None:
        """End every worker: those told to exit end on their own (their envs closed), the
        others are told now; one that has not ended within ``EXIT_S`` is killed."""
        for worker in self.workers:
            if not worker.leaving:
                with contextlib.suppress(Gone):
                    worker.link.send(EXIT)
                worker.leaving = True
        try:
            deadline = time.monotonic() + EXIT_S
            while time.monotonic() < deadline:
                alive = [w for w in self.workers if w.process.is_alive()]
                if not alive:
                    break
                for worker in alive:  # what they still send is left unread: the run has ended
                    while worker.link.ready():
                        try:
                            worker.link.receive()
                        except Gone:
                            break
                wait([w.process.sentinel for w in alive], WAIT_S)
        finally:  # a second Ctrl-C meanwhile: they are killed
            for worker in self.workers:
                if worker.process.is_alive():
                    worker.process.kill()
                worker.process.join()
                worker.link.conn.close()
        # The summary lists the agents' files in seed order, as seeds one after another do.
        self.run.outputs = dict(sorted(self.run.outputs.items()))

    # ------------------------------------------------------------ what they send

    def _handle(self, worker: _Worker, message: object) -> None:
        if isinstance(message, WorkerChunk):
            self._record(worker, message)
        elif isinstance(message, Held):
            worker.held = True
            if message.seed is not None:
                worker.step = message.step
                self._keep(message.seed, message.agent, message.resume)
        elif isinstance(message, Done):
            worker.index = None
            self._keep(message.seed, message.agent, message.resume)
            self.finished[message.seed] = (message.steps, message.updates)
            self.unwritten.add(message.seed)
            if not self.collecting:
                # As seeds one after another: a finished seed's files are written while
                # others still train (with theirs: one monitor state in all).
                if self.run.cfg.checkpoint_every != 0 and (self.todo or self._training()):
                    self._write_together()
                else:
                    self._assign(worker)
        elif isinstance(message, Started):
            worker.started = True
            if message.device not in self.devices:
                self.devices.append(message.device)
                trains_on(self.run, self.devices)
        elif isinstance(message, Failed):
            raise self._failure(message)

    def _training(self) -> list[_Worker]:
        return [w for w in self.workers if w.index is not None and not w.leaving]

    def _record(self, worker: _Worker, chunk: WorkerChunk) -> None:
        """Record ``chunk`` as the run records a chunk of a seed it trains itself."""
        run = self.run
        record_chunk(run, chunk.seed, chunk, partial(_score, chunk))
        worker.step = chunk.step
        if chunk.video is not None and run.videos is not None:
            run.videos.keep(chunk.step, chunk.video)
        run.monitor.moved(chunk.step, chunk.seed)
        if not self.collecting and self.schedule.due(chunk.seed, chunk.step):
            self._write_together()

    def _keep(self, index: int, agent: Any, resume: Any) -> None:
        """Agent ``index``'s latest state, the one its files are written from."""
        if index not in self.agents:
            name = CHECKPOINT_FILES[self.run.cfg.backend.name]
            files = partial(self.agents.__getitem__, index), partial(self._resume_state, index)
            set_agent_files(self.run, index, name, *files)
        self.agents[index], self.resumes[index] = agent, resume

    def _resume_state(self, index: int) -> dict[str, Any] | None:
        """What agent ``index``'s resume file holds when written (None: it stays as it is)."""
        resume = self.resumes.get(index) if self.consistent else None
        if isinstance(resume, Exception):  # could not be taken: that file's error
            raise resume
        return resume

    def _failure(self, failed: Failed) -> BaseException:
        """The exception the run ends with for agent ``failed.seed``'s failure: an env's
        is its one line, as a seed trained in this process would say it."""
        error = failed.error
        if isinstance(error, EnvFailed) and failed.at is not None:
            # Its state is not taken: the resume files stay as written last (``consistent``).
            written = self.written.get(failed.seed)
            return env_failure(self.run, error, failed.at, False, written)
        to_log_file(failed.trace)
        return error

    # ------------------------------------------------------------ every seed's files at once

    def _write_together(self) -> None:
        """Write every seed's files now: each worker training one holds at the end of its
        iteration and sends its state; the agents that finished since the last write are
        written with them; then the workers go on."""
        started = time.monotonic()
        held = self._hold()
        for index in sorted(held.keys() | self.unwritten):
            step = held.get(index, self.finished.get(index, (0, 0))[0])
            if write_now(self.run, index, step):
                self.written[index] = step
        self.unwritten.clear()
        for index in held:  # their replay buffers stay in the workers until wanted again
            self.resumes[index] = None
        self.schedule.written(held, time.monotonic() - started)
        self._release(GO)

    def _hold(self) -> dict[int, int]:
        """Hold every worker training an agent at the end of its iteration, recording what
        it sends until it holds; returns each held agent's env step."""
        holding = self._training()
        for worker in holding:
            worker.held = False
            self._send(worker, HOLD)
        self.collecting = True
        try:
            while not all(worker.held for worker in holding):
                self._receive()
        finally:
            self.collecting = False
        return {w.index: w.step for w in holding if w.index is not None}

    def _release(self, order: str) -> None:
        """Let the held workers go on (GO) or end (EXIT); hand the idle ones their next agent."""
        for worker in self.workers:
            if worker.held and not worker.leaving:
                worker.held = False
                worker.leaving = order == EXIT
                self._send(worker, order)
        for worker in self.workers:
            if worker.index is None and not worker.leaving:
                self._assign(worker)

    def _stop(self) -> bool:
        """Ctrl-C or SIGTERM: every worker stops at the end of its iteration and sends its
        state, for the run's files; True once all have (one that failed meanwhile is said
        in a warning: the resume files then stay as written last)."""
        self.todo.clear()
        try:
            self._hold()
            self._release(EXIT)
        except Exception as error:  # noqa: BLE001 - the interrupt ends the run either way
            log.warning("%s", error)
            return False
        return True


class TogetherSchedule:
    """When every seed's files are written together while they train (``checkpoint_every``):
    an integer N once a seed in training has trained N env steps since its files were last
    written (or since it started), ``auto`` as a run in one process (``CheckpointSchedule``),
    0 never; never at a seed's last step, whose end writes its files."""

    def __init__(self, every: int | str, total_steps: int) -> None:
        self.every, self.total_steps = every, total_steps
        self.next: dict[int, int] = {}
        self._since, self._wait_s = time.monotonic(), AUTO_PERIOD_S

    def start(self, index: int, step: int) -> None:
        """Agent ``index`` starts (or was written) at env step ``step``."""
        if isinstance(self.every, int):
            self.next[index] = step + self.every

    def due(self, index: int, step: int) -> bool:
        if step >= self.total_steps or self.every == 0:
            return False
        if isinstance(self.every, str):  # auto
            return time.monotonic() - self._since >= self._wait_s
        return step >= self.next[index]

    def written(self, steps: dict[int, int], seconds: float) -> None:
        """Every seed's files were written, in ``seconds``, those training at ``steps``."""
        for index, step in steps.items():
            self.start(index, step)
        self._since = time.monotonic()
        self._wait_s = max(AUTO_PERIOD_S, AUTO_WRITE_RATIO * seconds)


def _score(chunk: WorkerChunk) -> float:
    """The score the worker computed where the run's monitor wants one."""
    if chunk.score is None:  # the worker counts evaluations as the monitor does
        raise RuntimeError(f"seed {chunk.seed}'s worker sent no score at step {chunk.step}")
    return chunk.score


def _worker_config(cfg: RunConfig, number: int, gpus: int) -> RunConfig:
    """Worker ``number``'s config: where the agents live on several GPUs, its own."""
    if gpus <= 1:
        return cfg
    backend = dataclasses.replace(cfg.backend, device=f"cuda:{number % gpus}")
    return dataclasses.replace(cfg, backend=backend)


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM in this thread while a worker starts: it starts with them
    blocked and ignores them before it takes them; here they arrive once the block ends."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
