"""``tracking=none``: record nothing beyond the run's output folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlspeed.tracking import TrackerSpec


class NoTracker:
    run_id: str | None = None
    failure: str | None = None

    def start(
        self, run_name: str, params: dict[str, Any], tags: dict[str, str], run_id: str | None = None
    ) -> None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        return None

    def log_artifact(self, path: Path) -> None:
        return None

    def set_tags(self, tags: dict[str, str]) -> None:
        return None

    def flush(self) -> None:
        return None

    def links(self) -> dict[str, str]:
        return {}

    def end(self, status: str) -> None:
        return None


SPEC = TrackerSpec(name="none", make=lambda cfg, out_dir: NoTracker(), check=lambda cfg: None)
