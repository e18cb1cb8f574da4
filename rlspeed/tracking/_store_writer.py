"""The writer's thread in a tracking child process (``rlspeed.tracking._writer``): the
``Store`` it drives (one run in MLflow or TensorBoard), the ``Row`` it writes, and the
``StoreWriter`` that writes them.

A ``StoreWriter`` writes on a thread of its own; a store that stops answering costs training
nothing: the writer keeps every record it could not write, in order, tries again every
``RETRY_SECONDS``, and a store that answers again gets them all. ``flush`` and ``end`` try at
once and wait for the outcome.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

log = logging.getLogger("rlspeed")

# Between two tries of a store that failed. One try of an HTTP store that refuses connections
# takes ~7 s of retries (rlspeed.tracking.mlflow), all in the writer.
RETRY_SECONDS = 5.0
# Metrics per store call: MLflow's log_batch takes at most 1000, and one call is one
# transaction, so a failed call can be tried again without writing a row twice.
MAX_METRICS_PER_CALL = 1000


class Row(NamedTuple):
    metrics: dict[str, float]
    step: int
    # When training recorded it (not when it was written).
    timestamp_ms: int


class Store(Protocol):
    """One run in one store, as the writer drives it; every call raises on failure."""

    run_id: str | None
    # What a store that stopped answering raises (anything else is a bug, and propagates).
    errors: tuple[type[BaseException], ...]

    def start(
        self, run_name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None
    ) -> None:
        """Start the run (once: a start tried again after a failure reuses its run)."""

    def log_rows(self, rows: list[Row]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def end(self, status: str) -> None: ...

    def links(self) -> dict[str, str]: ...

    def lost(self, error: BaseException) -> str:
        """Why the store failed, in one phrase naming it."""


# What the writer holds until the store has it: rows, or one call on the store.
Record = list[Row] | Callable[[Store], None]


class _Control(NamedTuple):
    # Set once everything queued before it has been tried.
    done: threading.Event
    # The last control: end the thread after that try.
    last: bool = False


class StoreWriter:
    """``make()``'s store, written on a thread of its own (the module docstring).

    ``failure`` says why some records are not in the store yet (None when all are).
    """

    def __init__(self, make: Callable[[], Store]) -> None:
        self._make = make
        self.store: Store | None = None
        self._queue: queue.SimpleQueue[Record | _Control] = queue.SimpleQueue()
        self._held: list[Record] = []
        self._thread = threading.Thread(target=self._work, name="rlspeed-tracking", daemon=True)
        self.failure: str | None = None

    def put(self, record: Record) -> None:
        if not self._thread.is_alive():
            self._thread.start()
        self._queue.put(record)

    def flush(self, last: bool = False) -> None:
        """Try everything queued now and wait for the outcome; ``last``: then stop."""
        if not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(_Control(done, last))
        while not done.wait(1.0) and self._thread.is_alive():
            pass
        if last:
            self._thread.join()

    def _work(self) -> None:
        try:
            self._write_until_last()
        except Exception as error:  # a bug: say so; training and its files go on
            self.failure = f"the tracking writer failed ({error!r})"
            log.exception("rlspeed: %s", self.failure)

    def _write_until_last(self) -> None:
        try:
            self.store = self._make()
        except Exception as error:  # the store's library failed to load: nothing is recorded
            self.failure = f"the tracker could not be loaded ({error})"
            log.warning("rlspeed: %s; the run goes on and keeps its results", self.failure)
        retry_at: float | None = None
        while True:
            wait = None if retry_at is None else max(0.0, retry_at - time.monotonic())
            try:
                items = [self._queue.get(timeout=wait)]
            except queue.Empty:  # time to try the store again
                items = []
            while True:  # everything queued meanwhile: rows go out together
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            controls = [item for item in items if isinstance(item, _Control)]
            for item in items:
                if not isinstance(item, _Control):
                    self._hold(item)
            # While waiting to retry, new records only queue up; a control tries at once.
            if retry_at is None or controls or not items:
                retry_at = None if self._write_held() else time.monotonic() + RETRY_SECONDS
            for control in controls:
                control.done.set()
                if control.last:
                    return

    def _hold(self, record: Record) -> None:
        last = self._held[-1] if self._held else None
        if isinstance(record, list) and isinstance(last, list):
            size = sum(len(row.metrics) for row in last + record)
            if size <= MAX_METRICS_PER_CALL:
                last.extend(record)
                return
        self._held.append(record)

    def _write_held(self) -> bool:
        """Write the held records in order, stopping at the first the store refuses."""
        store = self.store
        if store is None:
            self._held.clear()
            return True
        while self._held:
            record = self._held[0]
            try:
                if isinstance(record, list):
                    store.log_rows(record)
                else:
                    record(store)
            except store.errors as error:
                if self.failure is None:
                    log.warning(
                        "rlspeed: %s; the run goes on, and rlspeed keeps what it records and "
                        "tries again every %.0f s",
                        store.lost(error),
                        RETRY_SECONDS,
                    )
                self.failure = store.lost(error)
                return False
            self._held.pop(0)
        if self.failure is not None:
            log.info("rlspeed: the tracking store answers again; every held record is written")
            self.failure = None
        return True
