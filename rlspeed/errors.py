"""Errors that reach the user as one clear line, the interrupt that stops a run, and the
hold that keeps it to the end of a training iteration."""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlspeed.secrets import mask, mask_value


class RLSpeedError(Exception):
    """An error the user reads as its message alone, one line (the command line prints it
    so, exit code 1: ``rlspeed.cli``). A password in a URL it names is masked: the message
    is printed, logged, sent back from the job's process and recorded (metrics.json, the
    study's failed trials)."""

    def __init__(self, message: str) -> None:
        super().__init__(mask(message))


class EnvFailed(Exception):
    """An env's own code failed as rlspeed called it (``call``: reset, step, close): it
    raised, exited, or its worker process ended. ``said``: that in one line; ``trace``: the
    traceback as text, for the run's log file. The training loop, which knows the env step,
    turns it into the run's one line."""

    def __init__(self, env: str, call: str, said: str, trace: str) -> None:
        super().__init__(f"env {env} failed in its {call}: {said}")
        self.env, self.call, self.said, self.trace = env, call, said, trace

    def __reduce__(self) -> tuple[type[EnvFailed], tuple[str, str, str, str]]:
        # A seed worker's env failure travels to the run's process pickled.
        return (type(self), (self.env, self.call, self.said, self.trace))


class EnvCode:
    """Around a call into an env's own code (a user's, maybe): what it raises, a
    ``sys.exit`` in it, or a gym-async worker process that ends becomes one EnvFailed naming
    the env and what it said. With ``workers`` (gym-async), the warnings through which
    Gymnasium hands a worker's traceback to this process are kept for the log file rather
    than printed; elsewhere the exception carries the traceback, and warnings are left alone
    (catching them costs every step, and resets Python's once-per-place record of them).
    ``failed`` is called before the EnvFailed is raised.

    A class rather than a generator's context manager: an engine enters one every env step
    (a generator's, with its ExitStack, cost a one-env DQN run 15 us a step)."""

    def __init__(
        self, env: str, call: str, workers: bool = False, failed: Callable[[], None] | None = None
    ) -> None:
        self.env, self.call, self.workers, self.failed = env, call, workers, failed
        self._catching: warnings.catch_warnings[list[warnings.WarningMessage]] | None = None
        self._caught: list[warnings.WarningMessage] = []

    def __enter__(self) -> None:
        if self.workers:
            self._catching = warnings.catch_warnings(record=True)
            self._caught = self._catching.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: object
    ) -> None:
        caught, self._caught = self._caught, []
        if self._catching is not None:
            self._catching.__exit__(None, None, None)
            self._catching = None
        if error is None:  # a call that went well: its warnings as they would have been
            for warning in caught:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, 0)
            return
        if not isinstance(error, (Exception, SystemExit)):  # Ctrl-C and the like go on
            return
        told = "\n".join(str(warning.message) for warning in caught)
        text = "".join(traceback.format_exception(error)) + told
        if self.failed is not None:
            self.failed()
        raise EnvFailed(self.env, self.call, _said(error), text) from None


def _said(error: BaseException) -> str:
    """What the env's code said, in one line: the exception, or where a gym-async worker
    ended without one (``sys.exit``, ``os._exit``, killed), that it ended."""
    if isinstance(error, (EOFError, BrokenPipeError, ConnectionResetError)):
        return "its worker process ended (the env exited or was killed)"
    if isinstance(error, SystemExit):
        return f"it called sys.exit({error.code!r})"
    if isinstance(error, multiprocessing.TimeoutError):  # env.step_timeout_s passed
        return f"it did not answer (hangs?): {' '.join(str(error).split())}"
    return one_line(error)[:300]


def one_line(error: BaseException) -> str:
    """An exception as one line: its type and its message, whitespace folded."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


class ConfigError(RLSpeedError):
    """A config value that is not allowed: names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, mask_value(value), mask(allowed)
        shown = str(self.value)  # masked before it is cut: a cut URL would no longer match
        if len(shown) > 60:  # a 400-digit number or a pasted file stays one readable line
            shown = f"{shown[:30]}... ({len(shown)} characters)"
        super().__init__(f"rlspeed: invalid {key}={shown}: expected {allowed}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str]]:
        # Jobs in other processes (hydra/launcher=joblib) send their exception back pickled.
        return (type(self), (self.key, self.value, self.allowed))


class StoreUnreachable(ConfigError):
    """A tracking store that does not answer: a lone run is refused before it trains; a
    trial of a running sweep (whose store answered when the sweep started) trains anyway
    and keeps its records locally (``rlspeed.validation.validate``)."""


class DivergenceError(RLSpeedError):
    """Training produced a non-finite loss; stopping beats training on garbage."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT), SIGTERM (a scheduler's preemption, `timeout`) or SLURM's SIGUSR2: the
    run ends as KILLED with what it recorded saved, and the command exits 128 + the signal's
    number (a SLURM job warned with SIGUSR2 is requeued first: rlspeed.slurm)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signal.Signals(signum).name}")
        self.signum = signum
        # The output folder of the run it stopped, once that run has saved its outputs.
        self.out_dir: Path | None = None


def interrupt(signum: int, frame: object) -> None:
    """Signal handler: stop whatever the main thread is doing with ``Interrupted``."""
    raise Interrupted(signum)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[Callable[[], None]]:
    """Hold Ctrl-C, SIGTERM and (in a SLURM job) SIGUSR2 until the loop reaches the end of an
    iteration.

    Yields ``check()``, which the loop calls there: a signal that arrived meanwhile is
    handed to the handler it would have reached (raising KeyboardInterrupt), so the
    checkpoint written on the way out holds a whole iteration, never half of one. A
    signal that arrives after the loop is handed over on leaving the block. A second
    signal before the iteration ends is handed over at once (a user pressing Ctrl-C
    again wants out now; that checkpoint may then hold part of an iteration)."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    pending: list[tuple[int, Any]] = []
    previous: dict[int, Callable[[int, Any], Any]] = {}
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
        handler = signal.getsignal(stop)
        if callable(handler):
            previous[stop] = handler

    def hold(signum: int, frame: Any) -> None:
        pending.append((signum, frame))
        if len(pending) > 1:
            check()

    def check() -> None:
        if pending:
            signum, frame = pending.pop(0)
            pending.clear()
            restore_handlers()
            previous[signum](signum, frame)

    def restore_handlers() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    for held in previous:
        signal.signal(held, hold)
    try:
        yield check
    finally:
        restore_handlers()
    check()
