"""``tracking=tensorboard``: each run's metrics as TensorBoard event files.

The files go to ``tracking.log_dir`` if set, else to ``tensorboard/`` in the run's output
folder; with a ``log_dir`` of their own, runs write to ``<log_dir>/<date or sweep>/<run
folder's name>``, one folder per run (``tensorboard --logdir`` names each run by its
folder, and runs sharing one would mix their curves). Metric names and steps are
MLflow's (a multi-seed run's seeds as ``seed<i>/<name>``); the run's params go to
TensorBoard's HParams view and, with its tags, to its Text view. Artifacts stay where they
are, in the run's output folder.

Written by the tracking writer process, as MLflow is (``rlspeed.tracking._writer``): each
batch of rows is on disk when ``flush`` returns, and a killed run keeps what it recorded.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlspeed.config_tree import check_creatable
from rlspeed.tracking import TrackerSpec, cause
from rlspeed.tracking._store_writer import Row
from rlspeed.tracking._writer import WriterProcess

if TYPE_CHECKING:
    from types import SimpleNamespace

    from omegaconf import DictConfig


def log_dir(cfg: Any, out_dir: Path) -> Path:
    """The folder of the run's event files (the module docstring)."""
    if cfg.log_dir is None:
        return out_dir / "tensorboard"
    return Path(cfg.log_dir) / out_dir.parent.name / out_dir.name


def _markdown_table(values: dict[str, str]) -> str:
    """``values`` as a Markdown table (TensorBoard's Text view renders Markdown)."""
    rows = [f"| {key} | {str(value).replace('|', '&#124;')} |" for key, value in values.items()]
    return "\n".join(["| key | value |", "|---|---|", *rows])


def _hparam(value: str) -> float | str:
    """A param as HParams shows it: numbers as numbers (sortable, plotted), else text."""
    try:
        return float(value)
    except ValueError:
        return value


class TensorBoardStore:
    """One run's event files, driven by the tracking writer (``_store_writer.Store``).
    Records are written synchronously, each call's flushed: a call that fails (a full disk)
    raises, and the writer tries its records again later, into a new event file (the failed
    one may end in a partial record, which TensorBoard skips)."""

    def __init__(self, cfg: SimpleNamespace) -> None:
        self.errors: tuple[type[BaseException], ...] = (OSError,)
        self.log_dir = Path(cfg.log_dir)
        # Never an MLflow run id: metrics.json's mlflow_run_id stays null.
        self.run_id: str | None = None
        self._file: Any = None  # the open RecordWriter, None until the first write
        self._files = 0

    def _write(self, events: list[Any]) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        try:
            if self._file is None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                self._files += 1
                # TensorBoard reads the files of a folder in name order: time first.
                name = f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}"
                path = self.log_dir / f"{name}.{os.getpid()}.{self._files}"
                self._file = RecordWriter(path.open("ab"))
                version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
                self._file.write(version.SerializeToString())
            for event in events:
                self._file.write(event.SerializeToString())
            self._file.flush()
        except OSError:
            self._close()  # the next try starts a new file
            raise

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            # What it could not write is written again, to another file.
            with contextlib.suppress(OSError):
                file.close()

    def _text(self, tag: str, text: str, step: int = 0) -> Any:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text import metadata
        from tensorboard.util import tensor_util

        value = summary_pb2.Summary.Value(
            tag=tag,
            tensor=tensor_util.make_tensor_proto(text),
            metadata=metadata.create_summary_metadata(display_name=tag, description=""),
        )
        return event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])
        )

    def start(
        self, run_name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None
    ) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.hparams import summary_v2 as hparams

        hparams_summary = hparams.hparams_pb(
            {key: _hparam(value) for key, value in params.items()}, trial_id=run_name
        )
        events = [event_pb2.Event(wall_time=time.time(), summary=hparams_summary)]
        events.append(self._text("config", _markdown_table(params)))
        events.append(self._text("tags", _markdown_table({"run": run_name, **tags})))
        self._write(events)

    def log_rows(self, rows: list[Row]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self._write(
            [
                event_pb2.Event(
                    wall_time=row.timestamp_ms / 1000,
                    step=row.step,
                    summary=summary_pb2.Summary(
                        value=[
                            summary_pb2.Summary.Value(tag=name, simple_value=value)
                            for name, value in row.metrics.items()
                        ]
                    ),
                )
                for row in rows
            ]
        )

    def log_artifact(self, path: Path) -> None:
        return None  # the file is in the run's output folder already

    def set_tags(self, tags: dict[str, str]) -> None:
        self._write([self._text("tags", _markdown_table(tags))])

    def end(self, status: str) -> None:
        self._write([self._text("status", status)])
        self._close()

    def links(self) -> dict[str, str]:
        return {"TensorBoard": f"tensorboard --logdir {shlex.quote(str(self.log_dir))}"}

    def lost(self, error: BaseException) -> str:
        return f"the TensorBoard log folder {self.log_dir} failed ({cause(error)})"


def preload() -> None:
    """What the tracking writers' zygote loads once for all of them (``_writer``)."""
    from tensorboard.compat.proto import event_pb2  # noqa: F401
    from tensorboard.plugins.hparams import summary_v2  # noqa: F401
    from tensorboard.summary.writer import record_writer  # noqa: F401


def make_store(cfg: SimpleNamespace) -> TensorBoardStore:
    """The store the tracking writer process drives (``rlspeed.tracking._writer``)."""
    return TensorBoardStore(cfg)


def make_tracker(cfg: DictConfig, out_dir: Path) -> WriterProcess:
    """The run's tracker: its event files written by a process of its own."""
    return WriterProcess(__name__, {"log_dir": str(log_dir(cfg, out_dir).resolve())})


def check(cfg: DictConfig) -> None:
    """A ``log_dir`` where rlspeed cannot create folders is refused before any training."""
    if cfg.log_dir is not None:
        folder = Path(cfg.log_dir)
        check_creatable("tracking.log_dir", cfg.log_dir, folder, "a folder rlspeed can write to")


SPEC = TrackerSpec(name="tensorboard", make=make_tracker, check=check)
