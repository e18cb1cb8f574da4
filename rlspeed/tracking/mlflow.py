"""``tracking=mlflow``: params, metrics, tags and artifacts of each run in an MLflow store.

The store is ``tracking.uri`` if set, else ``MLFLOW_TRACKING_URI``, else MLflow's
default local store (``sqlite:///mlflow.db`` in the working directory).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from rlspeed.errors import ConfigError
from rlspeed.tracking import TrackerSpec

# MLflow caps a param value at 6000 characters; longer values are cut, not dropped.
_MAX_PARAM_LENGTH = 6000


def resolve_uri(cfg: Any) -> str | None:
    return cfg.uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def check(cfg: Any) -> None:
    """Fail fast on a store that cannot be reached, before any training."""
    uri = resolve_uri(cfg)
    if uri is None:
        return
    parsed = urllib.parse.urlparse(uri)
    key = "tracking.uri" if cfg.uri else "MLFLOW_TRACKING_URI"
    if parsed.scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5):
                pass
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ConfigError(key, uri, f"a reachable MLflow server ({reason})") from None
    elif parsed.scheme in ("", "file", "sqlite"):
        path = parsed.path if parsed.scheme else uri
        if parsed.scheme == "sqlite":
            path = uri.removeprefix("sqlite:///")
            path = "/" + path if uri.startswith("sqlite:////") else path
            path = os.path.dirname(path) or "."
        parent = Path(path)
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not os.access(parent, os.W_OK):
            raise ConfigError(key, uri, f"a writable location ({parent} is not writable)")


class MlflowTracker:
    def __init__(self, cfg: Any) -> None:
        import mlflow

        self._mlflow = mlflow
        uri = resolve_uri(cfg)
        if uri is not None:
            mlflow.set_tracking_uri(uri)
        self._experiment = cfg.experiment
        self._parent_run_id = cfg.parent_run_id
        self.run_id: str | None = None

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> None:
        mlflow = self._mlflow
        mlflow.set_experiment(self._experiment)
        if self._parent_run_id:
            # Nested under a study's parent run that may live in another process: the tag
            # alone is what MLflow uses to nest runs.
            tags = {**tags, "mlflow.parentRunId": self._parent_run_id}
        run = mlflow.start_run(run_name=run_name, tags=tags, nested=mlflow.active_run() is not None)
        self.run_id = run.info.run_id
        mlflow.log_params({k: str(v)[:_MAX_PARAM_LENGTH] for k, v in params.items()})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics(metrics, step=step, run_id=self.run_id)

    def log_artifact(self, path: Path) -> None:
        self._mlflow.log_artifact(str(path), run_id=self.run_id)

    def set_tags(self, tags: dict[str, str]) -> None:
        client = self._mlflow.MlflowClient()
        for key, value in tags.items():
            client.set_tag(self.run_id, key, value)

    def end(self, status: str) -> None:
        if self.run_id is not None:
            self._mlflow.end_run(status=status)


SPEC = TrackerSpec(name="mlflow", make=MlflowTracker, check=check)
