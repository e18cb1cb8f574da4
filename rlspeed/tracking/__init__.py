"""Where runs are recorded: one module per ``tracking`` option."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    @property
    def run_id(self) -> str | None:
        """The tracked run's id (None before it starts, or where it could not)."""

    # Why the run could not be fully recorded (the store stopped answering), None while it
    # records. A tracker that fails stops recording and lets training go on.
    failure: str | None

    def start(
        self, run_name: str, params: dict[str, Any], tags: dict[str, str], run_id: str | None = None
    ) -> None:
        """Start recording a run; ``run_id``: continue that run (a requeued job's) instead."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record one row; it may be written later, but before ``flush`` returns."""

    def log_artifact(self, path: Path) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def flush(self) -> None:
        """Write everything recorded so far (``failure`` then says what could not be)."""

    def links(self) -> dict[str, str]:
        """Where to see the run (label -> URL or command); {} where there is nowhere."""

    def end(self, status: str) -> None:
        """Write what is left and close the run; status: FINISHED, FAILED or KILLED."""


def cause(error: BaseException) -> str:
    """Why a write or a request failed, in a few words: the OS's reason where one is in the
    exception's chain (torch.save reports a full disk as a RuntimeError whose context is the
    OSError; MLflow a dead server as an MlflowException caused by ConnectionRefusedError),
    else the first line of the innermost exception."""
    innermost: BaseException | None = error
    while innermost is not None:
        if isinstance(innermost, OSError) and innermost.strerror:
            return innermost.strerror
        error = innermost
        innermost = innermost.__cause__ or innermost.__context__
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


def artifact_folder(path: Path, out_dir: Path) -> str | None:
    """Where a run's file goes among its tracked artifacts: the folder it is in inside the
    run folder (``videos``), None for the run folder's own files (and files elsewhere)."""
    if not path.parent.is_relative_to(out_dir) or path.parent == out_dir:
        return None
    return path.parent.relative_to(out_dir).as_posix()


@dataclass(frozen=True)
class TrackerSpec:
    name: str
    # make(tracking config, the run's output folder)
    make: Callable[[Any, Path], Tracker]
    # Raises ConfigError when the tracker cannot work (e.g. unreachable URI).
    check: Callable[[Any], None]
