"""Where runs are recorded: one module per ``tracking`` option."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    run_id: str | None

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def end(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""


@dataclass(frozen=True)
class TrackerSpec:
    name: str
    make: Callable[[Any], Tracker]
    # Raises ConfigError when the tracker cannot work (e.g. unreachable URI).
    check: Callable[[Any], None]
