"""The job side of an Optuna sweep: a run that is a study's trial reports its score to it.

The Optuna sweeper (``hydra/sweeper=optuna``) asks the study for trials and launches one job
per trial with ``trial.storage``, ``trial.study_name`` and ``trial.number`` set. Jobs may run
in other processes (``hydra/launcher=joblib``) or on other machines, so a job attaches to its
trial through the study's storage, reports every evaluation to it and stops as soon as the
study's pruner says so. The sweeper records the pruner it uses in the study (system
attribute ``PRUNER_ATTR``) because a pruner is not part of a study's storage.

The study's storage (``hydra.sweeper.storage``) is checked, opened and, for a journal file
whose last write was cut short, repaired here, for the sweeper and its jobs alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlspeed.config_tree import uncreatable, unreachable
from rlspeed.errors import ConfigError, RLSpeedError
from rlspeed.secrets import reveal

if TYPE_CHECKING:
    from rlspeed.config import RunConfig

log = logging.getLogger("rlspeed")

# The sweep's process id, set by the Optuna sweeper before it launches jobs: a job in a
# worker process of the sweep (hydra/launcher=joblib) stops when the sweep is gone.
SWEEP_PID_VARIABLE = "RLSPEED_SWEEP_PID"
# Whether this process watches its sweep already (a worker runs many jobs).
_watching: list[bool] = []
# Set once the sweep that launched this worker is gone.
_sweep_gone = threading.Event()
# Study system attribute holding the pruner's config (a dict with ``_target_``).
PRUNER_ATTR = "rlspeed:pruner"
JOURNAL_PREFIX = "journal:"
STORAGE_KEY = "hydra.sweeper.storage"
STORAGE_ALLOWED = (
    "a journal file in a writable folder (PATH.journal or journal:PATH) or a database URL "
    "whose driver is installed (sqlite:///PATH, postgresql://USER@HOST:PORT/DB)"
)
# How far from a journal's end a cut-short record is looked for.
_JOURNAL_TAIL_BYTES = 1 << 20
# The longest file or folder name rlspeed lets a setting make (study names, storage files,
# output folders): file systems allow 255 bytes, and rlspeed adds suffixes (.journal,
# .<time>.broken) to some.
MAX_NAME_CHARS = 200
# Significant digits of the values a study records: equal scores that float noise made
# differ (0.30000000000000004 and 0.3) tie, for the sampler, the pruner and best trials.
SIGNIFICANT_DIGITS = 6


def stop_with_sweep() -> None:
    """In a worker process of a sweep, SIGTERM this process once the sweep's process is gone:
    a SIGKILLed sweep tells nobody, and its trials would train on for no one. The trial then
    stops as on a scheduler's SIGTERM (what it recorded is saved, its run is KILLED). Jobs
    in the sweep's own process (the basic launcher) or on other machines (SLURM) have
    another parent and are left alone."""
    sweep = os.environ.get(SWEEP_PID_VARIABLE, "")
    if _watching or not sweep.isdigit() or os.getppid() != int(sweep):
        return
    _watching.append(True)

    def watch() -> None:
        while os.getppid() == int(sweep):
            time.sleep(1.0)
        _sweep_gone.set()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rlspeed-sweep-watch", daemon=True).start()


def exit_if_sweep_gone() -> None:
    """End this worker, its trial saved, if its sweep is gone: no one will send it another
    job, and a pool's worker would otherwise wait for one."""
    if _sweep_gone.is_set():
        logging.shutdown()
        os._exit(128 + signal.SIGTERM)


def study_value(value: float) -> float:
    """``value`` rounded to SIGNIFICANT_DIGITS, as the study records it."""
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def journal_path(spec: str) -> Path | None:
    """The journal file a storage string names, or None for a database URL.

    ``journal:PATH`` or a path ending in ``.journal`` is an Optuna journal file (safe for
    several processes on one machine, no database needed); anything else is an RDB URL
    such as ``sqlite:///study.db`` or ``postgresql://host/db``.
    """
    if spec.startswith(JOURNAL_PREFIX) or spec.endswith(".journal"):
        return Path(spec.removeprefix(JOURNAL_PREFIX)).expanduser().absolute()
    return None


def _sqlite_path(spec: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL (None for other URLs and in-memory)."""
    if not spec.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(spec).database
    if database in (None, "", ":memory:"):
        return None
    return Path(database).expanduser().absolute()


def _with_driver(spec: str) -> str:
    """A ``postgresql://`` (or ``postgres://``) URL with the driver rlspeed installs,
    psycopg 3 (SQLAlchemy before 2.1 defaults to psycopg2). Other strings as given."""
    scheme, sep, rest = spec.partition("://")
    if sep and scheme in ("postgresql", "postgres"):
        return f"postgresql+psycopg://{rest}"
    return spec


def normalize_storage(spec: str) -> str:
    """``spec`` as any process opens it, whatever its working directory: a journal or
    SQLite file by its absolute path (a journal keeps ``journal:`` unless its name ends in
    ``.journal``, so that it still reads as a journal), a PostgreSQL URL with its driver."""
    path = journal_path(spec)
    if path is not None:
        return str(path) if path.suffix == ".journal" else f"{JOURNAL_PREFIX}{path}"
    spec = _with_driver(spec)
    database = _sqlite_path(spec)
    if database is not None:
        from sqlalchemy.engine import make_url

        return make_url(spec).set(database=str(database)).render_as_string(hide_password=False)
    return spec


def check_storage(spec: str) -> None:
    """Raise ConfigError unless trials can be recorded in ``spec``; creates nothing."""
    problem = _storage_problem(spec)
    if problem is not None:
        raise ConfigError(STORAGE_KEY, spec, f"{STORAGE_ALLOWED}; {problem}")


def _storage_problem(spec: str) -> str | None:
    path = journal_path(spec)
    if path is not None:
        return _file_problem(path)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(_with_driver(spec))
        dialect = url.get_dialect()
    except NoSuchModuleError:  # before its base class ArgumentError
        return f"SQLAlchemy knows no database '{url.drivername}'"
    except ArgumentError:
        return "it is neither a journal file nor a database URL"
    try:
        dialect.import_dbapi()
    except ImportError as error:
        return f"its driver '{error.name}' is not installed"
    if url.get_backend_name() != "sqlite":
        problem = unreachable(str(url.render_as_string(hide_password=False)))
        return None if problem is None else f"the database server does not answer ({problem})"
    database = _sqlite_path(spec)
    if database is None:
        return "an in-memory database is lost at exit and unseen by the trials' jobs"
    return _file_problem(database)


def overlong_name(path: str | Path) -> str | None:
    """The first file or folder name in ``path`` longer than MAX_NAME_CHARS, if any."""
    return next((part for part in Path(path).parts if len(part) > MAX_NAME_CHARS), None)


def _file_problem(path: Path) -> str | None:
    """Why the file ``path`` cannot be written (or created, with its folders), or None."""
    if (name := overlong_name(path)) is not None:
        return f"a name in it has {len(name):,} characters, more than {MAX_NAME_CHARS}"
    if path.exists():
        if path.is_dir():
            return f"{path} is a folder"
        try:
            open(path, "ab").close()  # appends nothing
        except OSError as error:
            return f"{path} cannot be written ({error.strerror})"
        return None
    problem = uncreatable(path.parent)
    if problem is not None:
        where, why = problem
        return f"no file can be created in {where} ({why})"
    return None


def open_storage(spec: str, heartbeat: tuple[int, int] | None = None) -> Any:
    """An Optuna storage from a string: a journal file or a database URL (journal_path).

    ``heartbeat`` (interval, grace period in seconds) turns on a database's trial
    heartbeats (Optuna's RDBStorage). A journal whose last record was cut short is
    repaired first (repair_journal).
    """
    import optuna
    from optuna.storages.journal import JournalFileBackend

    path = journal_path(spec)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            repair_journal(path)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    database = _sqlite_path(spec)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)  # SQLite creates the file only
    spec = reveal(spec)
    beats: dict[str, Any] = {}
    if heartbeat is not None:
        beats = {"heartbeat_interval": heartbeat[0], "grace_period": heartbeat[1]}
    from sqlalchemy import create_engine

    engine = create_engine(spec)
    # Workers started together on a new database would all create Optuna's tables at once.
    try:
        with database_lock(engine, "optuna-schema"), warnings.catch_warnings():
            # Heartbeats are "experimental" since Optuna 2.9.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(spec, **beats)
    finally:
        engine.dispose()


def storage_engine(storage: Any) -> Any:
    """The SQLAlchemy engine of a database storage (None for a journal file)."""
    return getattr(storage, "engine", None)


@contextlib.contextmanager
def database_lock(engine: Any, name: str) -> Iterator[None]:
    """Hold rlspeed's lock ``name`` on a database server (PostgreSQL, MySQL): a session
    advisory lock, on a connection of its own, that other processes wait for. Nothing for
    SQLite or no engine (a journal file): their writes are serialized anyway."""
    dialect = engine.dialect.name if engine is not None else None
    if dialect not in ("postgresql", "mysql"):
        yield
        return
    from sqlalchemy import text

    name = f"rlspeed:{name}"
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    lock, unlock = {
        "postgresql": ("SELECT pg_advisory_lock(:key)", "SELECT pg_advisory_unlock(:key)"),
        "mysql": ("SELECT GET_LOCK(:name, -1)", "SELECT RELEASE_LOCK(:name)"),
    }[dialect]
    params = {"key": key, "name": name[:64]}  # MySQL's lock names: 64 characters at most
    with engine.connect() as connection:
        connection.execute(text(lock), params)
        connection.commit()  # the lock is the session's: it outlives the transaction
        try:
            yield
        finally:
            connection.execute(text(unlock), params)
            connection.commit()


def repair_journal(path: Path) -> None:
    """Drop a journal's last record if a write was cut short, keeping a copy of the file.

    A full disk or a crash mid-write leaves a last line that is not a whole JSON record.
    Optuna skips such a line when reading, but appends its next record to it: that line
    never parses again, and once anything follows it the journal cannot be read at all.
    """
    if _broken_tail(path) is None:
        return
    from optuna.storages.journal import JournalFileSymlinkLock

    # A writer appending right now also leaves a partial last line: look again under the
    # lock every writer of the journal takes.
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        cut = _broken_tail(path)
        if cut is None:
            return
        size = path.stat().st_size
        backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}.broken")
        try:
            shutil.copyfile(path, backup)
            with open(path, "r+b") as file:
                file.truncate(cut)
                os.fsync(file.fileno())
        except OSError as error:
            raise RLSpeedError(
                f"rlspeed: the journal {path} ends with a record cut short and cannot be "
                f"repaired ({error.strerror}): free some space and run again"
            ) from None
    finally:
        lock.release()
    log.warning(
        "rlspeed: the journal %s ended with a record cut short (%d bytes, e.g. by a full "
        "disk): dropped it; the file as it was is kept as %s",
        path,
        size - cut,
        backup,
    )


def _broken_tail(path: Path) -> int | None:
    """Where the broken end of a journal starts, or None if its last record is whole.

    Broken: bytes after the last newline (a record cut short), and a last line that does
    not parse (a record written after a cut-short one, glued to it; a zero-filled block).
    """
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        start = max(size - _JOURNAL_TAIL_BYTES, 0)
        file.seek(start)
        tail = file.read()
    end = tail.rfind(b"\n") + 1  # the end of the last whole line
    if end == 0 and start > 0:
        return None  # a line longer than the tail read: not a cut-short record
    begin = tail.rfind(b"\n", 0, end - 1) + 1 if end else 0
    if end and (begin > 0 or start == 0) and not _is_record(tail[begin:end]):
        end = begin
    return None if end == len(tail) else start + end


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return False


class TrialReporter:
    """Reports a run's evaluations to its Optuna trial; raises ``optuna.TrialPruned`` when
    the study's pruner stops it."""

    def __init__(self, trial: Any, total_steps: int) -> None:
        self.trial = trial
        self.total_steps = total_steps
        # Set once the study's storage could not record a report (a full disk under its
        # journal): the run trains on, unpruned, and keeps its results in its folder.
        self.unrecorded = False

    @classmethod
    def attach(cls, cfg: RunConfig) -> TrialReporter | None:
        """The reporter of the trial ``cfg.trial`` names, or None for a run outside a study."""
        spec = cfg.trial
        if spec.number is None:
            return None
        import optuna
        from hydra.utils import instantiate

        if not spec.storage or not spec.study_name:
            raise ValueError("trial.number needs trial.storage and trial.study_name")
        storage = open_storage(spec.storage)
        study_id = storage.get_study_id_from_name(spec.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, spec.number)
        pruner_cfg = storage.get_study_system_attrs(study_id).get(PRUNER_ATTR)
        pruner = instantiate(pruner_cfg) if pruner_cfg else optuna.pruners.NopPruner()
        # The job never samples: a random sampler keeps attaching cheap.
        study = optuna.load_study(
            study_name=spec.study_name,
            storage=storage,
            sampler=optuna.samplers.RandomSampler(),
            pruner=pruner,
        )
        if len(study.directions) > 1:  # Optuna cannot prune multi-objective trials
            return None
        return cls(optuna.trial.Trial(study, trial_id), cfg.total_steps)

    @property
    def pruned_error(self) -> type[Exception]:
        """What ``report`` raises when the pruner stops the run."""
        import optuna

        return optuna.TrialPruned

    def report(self, score: float, step: int) -> None:
        """Record ``score`` at env step ``step``; stop the run if the pruner says so."""
        import optuna

        if self.unrecorded:
            return
        try:
            self.trial.report(study_value(score), step)
        except optuna.exceptions.UpdateFinishedTrialError:
            # Its sweep is gone (killed) and another sweep of the study failed the trial.
            raise RLSpeedError(
                f"rlspeed: trial {self.trial.number} is no longer running in its study "
                "(its sweep stopped and another sweep marked it FAIL): this run stops"
            ) from None
        except OSError as error:
            self.unrecorded = True
            log.warning(
                "rlspeed: trial %d: the study's storage could not record its score at step "
                "%s (%s): the run goes on unpruned and keeps its results in its folder",
                self.trial.number,
                f"{step:,}",
                error.strerror or error,
            )
            return
        # The last evaluation is the trial's result: nothing is left to save by stopping.
        if step < self.total_steps and self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step:,} (score {score:.4f})")
