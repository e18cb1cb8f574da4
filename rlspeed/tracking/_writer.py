"""Tracking off training's path: a store written by a process of its own.

Training only hands over what it records (``WriterProcess``, the run's ``Tracker``); a child
process loads the store's library, starts the run and writes the rows, many per call. It
runs on its own interpreter, so MLflow's import and database (seconds of Python) take no
time from the training loop's thread, and it outlives a killed run long enough to write
what it was given and end the run KILLED. The children are forked by a zygote (``python -m
rlspeed.tracking._writer``, one per process and store) that has loaded the library once, so
a sweep's runs do not each pay its import.

In the child a ``StoreWriter`` thread writes (``_store_writer``): a store that stops
answering costs training nothing.

The two processes speak JSON lines: parent -> child the store's settings, then
``{"start"|"rows"|"artifact"|"tags"|"flush"|"end": ...}``; child -> parent ``{"log": level,
"message"}`` and, after a flush or the end, ``{"done": n, "failure", "run_id", "links"}``.
Nothing read is ever executed.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

from rlspeed import secrets
from rlspeed.tracking._environment import environment_tags
from rlspeed.tracking._store_writer import Row, Store, StoreWriter

log = logging.getLogger("rlspeed")

# The only modules the child loads a store from (each defines ``make_store(cfg)``).
STORE_MODULES = (
    "rlspeed.tracking.mlflow",
    "rlspeed.tracking.tensorboard",
    "rlspeed.tracking.wandb",
)


# ------------------------------------------------------------------ the child process


class _ToParent(logging.Handler):
    """The child's log records, sent to the parent, which logs them as its own."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(logging.INFO)
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        self._send({"log": record.levelname, "message": record.getMessage()})


def child_main(module: str) -> None:
    """The child: read the store's settings, then the parent's records, from stdin until
    ``end`` (or the parent is gone: then the run ends KILLED with everything it was given)."""
    if module not in STORE_MODULES:
        raise SystemExit(f"rlspeed: no tracking store in {module!r}")
    secrets.install()  # what the store's library logs or prints (its stderr is the run's)
    # The parent's channel is the stdout this process was given; what libraries print there
    # (MLflow prints "View run ... at: URL" when a run ends) goes nowhere instead.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    out_lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        with out_lock:
            try:
                channel.write(json.dumps(message) + "\n")
                channel.flush()
            except (BrokenPipeError, ValueError):
                # The parent is gone (killed before this answer): the records still go to
                # the store, and the run still ends, KILLED.
                pass

    log.addHandler(_ToParent(send))
    log.setLevel(logging.INFO)
    log.propagate = False
    cfg = SimpleNamespace(**json.loads(sys.stdin.readline()))
    writer = StoreWriter(lambda: importlib.import_module(module).make_store(cfg))

    def done(index: int) -> None:
        store = writer.store
        run_id = store.run_id if store is not None else None
        links = store.links() if store is not None else {}
        # The failure is recorded (metrics.json): an error naming a database URI is masked.
        failure = secrets.mask_value(writer.failure)
        send({"done": index, "failure": failure, "run_id": run_id, "links": links})

    # The calls on the store, each with its message's arguments (bound now: the writer's
    # thread makes the call later).
    def start(run: dict[str, Any], store: Store) -> None:
        tags = {**environment_tags(run["command"]), **run["tags"]}
        store.start(run["run_name"], run["params"], tags, run["run_id"])

    def log_artifact(path: Path, store: Store) -> None:
        store.log_artifact(path)

    def set_tags(tags: dict[str, str], store: Store) -> None:
        store.set_tags(tags)

    status = "KILLED"  # unless the parent says how the run ended
    for line in sys.stdin:
        message = json.loads(line)
        if "start" in message:
            writer.put(partial(start, message["start"]))
            writer.flush()  # the run id, for the parent's checkpoints and summary
            done(-1)
        elif "rows" in message:
            writer.put([Row(metrics, step, stamp) for metrics, step, stamp in message["rows"]])
        elif "artifact" in message:
            writer.put(partial(log_artifact, Path(message["artifact"])))
        elif "tags" in message:
            writer.put(partial(set_tags, message["tags"]))
        elif "flush" in message:
            writer.flush()
            done(message["flush"])
        elif "end" in message:
            status = message["end"]
            break
    writer.put(lambda store: store.end(status))
    writer.flush(last=True)
    done(0)
    # Nothing is left to do: skip tearing down MLflow's modules (~0.5 s the parent would wait).
    os._exit(0)


def zygote_main(module: str, control_fd: int) -> None:
    """The zygote (``WriterZygote``): load the store's library once, then fork a writer
    child for each run the parent asks for, on the two pipe ends that come with the ask.
    Without threads of its own, forking it is safe; it ends when the parent is gone."""
    if module not in STORE_MODULES:
        raise SystemExit(f"rlspeed: no tracking store in {module!r}")
    # The store's library, as its writers will use it: most of a writer's start (~1.6 s
    # of CPU for MLflow's import).
    importlib.import_module(module).preload()
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the writers
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        if not message or len(fds) != 2:  # the parent is gone
            return
        if os.fork() == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.dup2(fds[0], 0)
            os.dup2(fds[1], 1)
            for fd in fds:
                os.close(fd)
            os.environ.update(json.loads(message))
            sys.stdin = os.fdopen(0, "r")
            sys.stdout = os.fdopen(1, "w")
            try:
                child_main(module)
            finally:
                os._exit(1)  # child_main leaves with os._exit(0) once the run has ended
        for fd in fds:
            os.close(fd)


class WriterZygote:
    """A process that has loaded a store's library and forks the writer of each run: a
    writer starts in milliseconds instead of seconds of imports, which counts where a
    sweep's batch starts a run per trial at once. One per store module in a process."""

    _running: dict[str, WriterZygote] = {}

    def __init__(self, module: str) -> None:
        ours, theirs = socket.socketpair()
        # A session of its own, as each writer: Ctrl-C in the terminal stops training only.
        self.process = subprocess.Popen(
            self.command(module, theirs.fileno()),
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()

    @staticmethod
    def command(module: str, control_fd: int) -> list[str]:
        """The zygote's command line (which every user of the machine can read: ps), with
        no settings: those go to each writer on its stdin."""
        return [sys.executable, "-m", "rlspeed.tracking._writer", module, str(control_fd)]

    @classmethod
    def of(cls, module: str) -> WriterZygote:
        zygote = cls._running.get(module)
        if zygote is None or zygote.process.poll() is not None:
            zygote = cls._running[module] = cls(module)
        return zygote

    def spawn(self, env: dict[str, str]) -> tuple[TextIO, TextIO]:
        """A new writer: (its stdin, its stdout), ``env`` added to its environment."""
        to_child, into_child = os.pipe()
        from_child, out_of_child = os.pipe()
        try:
            with self.lock:
                socket.send_fds(self.control, [json.dumps(env).encode()], [to_child, out_of_child])
        finally:
            os.close(to_child)
            os.close(out_of_child)
        return os.fdopen(into_child, "w"), os.fdopen(from_child, "r")


# ------------------------------------------------------------------ the parent's tracker


class WriterProcess:
    """The run's ``Tracker``: hands each call to the child process and never waits for it,
    except in ``flush``, ``end`` and the run id (known once the child has started the run).
    ``failure``: why some records are not in the store (None while all are)."""

    def __init__(
        self,
        module: str,
        cfg: dict[str, Any],
        env: dict[str, str] | None = None,
        typed_params: bool = False,
    ) -> None:
        self._module = module
        # Params as their values (numbers, booleans, lists: W&B's config), else as text
        # (MLflow's params).
        self._typed_params = typed_params
        # The store's settings go on the child's stdin, not its command line, which every
        # user of the machine can read (ps): a database URI may hold a password. ``env``:
        # variables for the child alone (a server's user and password).
        self._settings = json.dumps(cfg)
        self._env = env or {}
        # The writer's stdin and stdout, once it is started.
        self._pipes: tuple[TextIO, TextIO] | None = None
        # Lines for the child, written by a thread: a full pipe never blocks training.
        self._outbox: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._answers: dict[int, threading.Event] = {}
        self._child_gone = threading.Event()
        self._flushes = 0
        self._run_id: str | None = None
        self._links: dict[str, str] = {}
        self.failure: str | None = None

    def start(
        self, run_name: str, params: dict[str, Any], tags: dict[str, str], run_id: str | None = None
    ) -> None:
        # Forked by the zygote, in its session: Ctrl-C in the terminal stops training, not
        # the writer, which then writes what the run recorded and its end.
        self._pipes = WriterZygote.of(self._module).spawn(self._env)
        self._outbox.put(self._settings)
        threading.Thread(target=self._send_lines, name="rlspeed-tracking-out", daemon=True).start()
        threading.Thread(target=self._read_answers, name="rlspeed-tracking-in", daemon=True).start()
        start = {
            "run_name": run_name,
            "params": {k: _param(v, self._typed_params) for k, v in params.items()},
            "tags": tags,
            "run_id": run_id,
            # This process's command line; the writer adds the rest (environment_tags).
            "command": sys.argv,
        }
        self._send({"start": start})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = [{name: float(value) for name, value in metrics.items()}, step, _now_ms()]
        self._send({"rows": [row]})

    def log_artifact(self, path: Path) -> None:
        self._send({"artifact": str(path.resolve())})

    def set_tags(self, tags: dict[str, str]) -> None:
        self._send({"tags": tags})

    def flush(self) -> None:
        self._flushes += 1
        self._ask({"flush": self._flushes}, self._flushes)

    def end(self, status: str) -> None:
        self._ask({"end": status}, 0)
        self._outbox.put(None)

    @property
    def run_id(self) -> str | None:
        """The tracked run's id, once the child has started it (None if it could not)."""
        self._wait(-1)
        return self._run_id

    def links(self) -> dict[str, str]:
        return self._links

    def _send(self, message: dict[str, Any]) -> None:
        if self._pipes is not None:
            self._outbox.put(json.dumps(message))

    def _ask(self, message: dict[str, Any], index: int) -> None:
        """Send ``message`` and wait for the child's answer ``index`` (or its exit)."""
        self._send(message)
        self._wait(index)

    def _wait(self, index: int) -> None:
        if self._pipes is None:
            return
        answer = self._answers.setdefault(index, threading.Event())
        while not answer.wait(0.2) and not self._child_gone.is_set():
            pass

    def _send_lines(self) -> None:
        assert self._pipes is not None
        pipe = self._pipes[0]
        while (line := self._outbox.get()) is not None:
            try:
                pipe.write(line + "\n")
                pipe.flush()
            except (BrokenPipeError, ValueError):  # the child is gone; _ask says so
                return
        pipe.close()

    def _read_answers(self) -> None:
        assert self._pipes is not None
        try:
            for line in self._pipes[1]:
                self._answer(json.loads(line))
        finally:
            # It ends once it has answered the run's end (answer 0); earlier, it failed.
            if 0 not in self._answers or not self._answers[0].is_set():
                self.failure = "the tracking writer process ended before the run did"
            self._child_gone.set()  # nobody waits for its answers any longer

    def _answer(self, message: dict[str, Any]) -> None:
        if "log" in message:
            log.log(logging.getLevelName(message["log"]), message["message"])
            return
        self._run_id = message["run_id"] or self._run_id
        self._links = message["links"] or self._links
        self.failure = message["failure"]
        self._answers.setdefault(message["done"], threading.Event()).set()


def _param(value: Any, typed: bool) -> Any:
    """A param as the writer gets it: text, or (``typed``) the value where JSON carries it
    as it is (numbers, booleans, null, text, lists of them), else its text."""
    if not typed:
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_param(item, typed) for item in value]
    if isinstance(value, dict):
        return {str(key): _param(item, typed) for key, item in value.items()}
    return str(value)


def _now_ms() -> int:
    return int(time.time() * 1000)


if __name__ == "__main__":
    zygote_main(sys.argv[1], int(sys.argv[2]))
