"""``tracking=mlflow``: params, metrics, tags and artifacts of each run in an MLflow store.

The store is ``tracking.uri`` if set, else ``MLFLOW_TRACKING_URI``, else MLflow's
default local store (``sqlite:///mlflow.db`` in the working directory). A server's
``http(s)://user:password@host`` is reached as ``http(s)://host`` with the user and password
in MLflow's variables (``server_credentials``); nothing shown or stored holds the password.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import importlib
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from rlspeed.config_tree import check_creatable, unreachable
from rlspeed.errors import ConfigError, StoreUnreachable
from rlspeed.secrets import mask, reveal, split_credentials
from rlspeed.tracking import TrackerSpec, artifact_folder, cause
from rlspeed.tracking._store_writer import Row
from rlspeed.tracking._writer import WriterProcess

if TYPE_CHECKING:
    from types import SimpleNamespace

    from omegaconf import DictConfig

    from rlspeed.config import TrackingConfig

log = logging.getLogger("rlspeed")

# MLflow 3's SQLAlchemy stores (mlflow.store.db.db_types.DATABASE_ENGINES).
_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
_STORES = "sqlite:///PATH.db, postgresql://, mysql://, mssql://, http(s)://HOST:PORT or databricks"
# MLflow caps a param value at 6000 characters; longer values are cut, not dropped.
_MAX_PARAM_LENGTH = 6000
# MLflow's own HTTP settings (7 retries with backoff factor 2, 120 s timeout) keep a run whose
# server died waiting ~4 minutes per request, ~12 minutes before it fails. These give up on a
# refused connection after ~7 s (3 retries, 0 + 2 + 4 s apart) and on a server that hangs
# after ~90 s; set only where the user has not set them.
_MLFLOW_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    # MLflow's usage telemetry (a background thread posting to the internet, which cluster
    # nodes often cannot reach): off. Its set-up failed 1 of 8 trial runs started together
    # on the local SLURM cluster (a KeyError on its session id in os.environ).
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # MLflow's INFO lines (creating the store's tables, then the experiment) came before
    # rlspeed's first line; its warnings and errors still show.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


# MLflow's database stores keep an experiment's name in a 256-character column.
MAX_EXPERIMENT_NAME = 256


def resolve_uri(cfg: TrackingConfig | DictConfig | SimpleNamespace) -> str | None:
    """The store's URI, its password put back where the command line had one."""
    uri = cfg.uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    return None if uri is None else reveal(uri)


# Where MLflow reads a server's user and password (it sends them as HTTP basic auth).
_CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


@overload
def server_credentials(uri: str) -> tuple[str, dict[str, str]]: ...


@overload
def server_credentials(uri: None) -> tuple[None, dict[str, str]]: ...


def server_credentials(uri: str | None) -> tuple[str | None, dict[str, str]]:
    """An MLflow server's URI without its ``user:password@``, and the variables that carry
    them to MLflow instead ({} when it has none, or is no server's). In the URI they would
    show in the run's links and messages, and urllib takes them for part of the host."""
    if uri is None or urllib.parse.urlparse(uri).scheme.lower() not in ("http", "https"):
        return uri, {}
    bare, user, password = split_credentials(uri)
    values = (user, password)
    return bare, {name: v for name, v in zip(_CREDENTIAL_VARIABLES, values, strict=True) if v}


def check(cfg: DictConfig) -> None:
    """Fail fast on a store that cannot record, before any training: a server that does not
    answer, a database whose Python driver is missing, a SQLite URI without a file, a folder
    that cannot be created, a file store (MLflow 3 refuses them) or an unknown scheme."""
    if not cfg.experiment.strip() or len(cfg.experiment) > MAX_EXPERIMENT_NAME:
        raise ConfigError(
            "tracking.experiment",
            cfg.experiment,
            f"a non-empty experiment name of at most {MAX_EXPERIMENT_NAME} characters",
        )
    uri = resolve_uri(cfg)
    if uri is None:
        return
    key = "tracking.uri" if cfg.uri else "MLFLOW_TRACKING_URI"
    scheme = urllib.parse.urlparse(uri).scheme.lower()
    if scheme in ("http", "https"):
        bare, credentials = server_credentials(uri)
        request = urllib.request.Request(bare.rstrip("/") + "/health")
        if len(credentials) == 2:  # MLflow's own auth leaves /health open; a proxy may not
            pair = ":".join(credentials[name] for name in _CREDENTIAL_VARIABLES)
            request.add_header("Authorization", f"Basic {base64.b64encode(pair.encode()).decode()}")
        try:
            with urllib.request.urlopen(request, timeout=5):
                pass
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise StoreUnreachable(key, uri, f"a reachable MLflow server ({reason})") from None
    elif scheme.partition("+")[0] in _DATABASES:  # e.g. postgresql+psycopg2://
        _check_database(key, uri)
    elif scheme in ("", "file"):
        _check_file_store(key, uri)
    elif scheme != "databricks":
        raise ConfigError(key, uri, f"a tracking URI MLflow can record to: {_STORES}")


def _check_database(key: str, uri: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
        dialect = url.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        raise ConfigError(key, uri, f"a database URL such as {_STORES} ({error})") from None
    try:
        dialect.import_dbapi()  # the driver MLflow's SQLAlchemy store will load
    except ImportError as error:
        raise ConfigError(
            key, uri, f"a database whose Python driver is installed (no module {error.name!r})"
        ) from None
    if url.get_backend_name() != "sqlite":  # a server: it must answer before the run starts
        problem = unreachable(uri)
        if problem is not None:
            raise StoreUnreachable(key, uri, f"a database server that answers ({problem})")
        return
    if url.database in (None, "", ":memory:"):  # in memory: gone when the run ends
        raise ConfigError(
            key, uri, "a database file: sqlite:///RELATIVE.db or sqlite:////ABSOLUTE.db"
        )
    folder = Path(url.database).parent
    check_creatable(key, uri, folder, "a database file in a folder rlspeed can write to")


def _check_file_store(key: str, uri: str) -> None:
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

    if not MLFLOW_ALLOW_FILE_STORE.get():
        raise ConfigError(
            key,
            uri,
            "a database or server URI such as sqlite:///mlflow.db: MLflow 3 refuses file "
            "stores (`mlflow migrate-filestore` converts one; MLFLOW_ALLOW_FILE_STORE=true "
            "keeps using it)",
        )
    path = urllib.parse.urlparse(uri).path if uri.startswith("file:") else uri
    check_creatable(key, uri, Path(path), "a folder rlspeed can create and write to")


def mlflow_client(uri: str) -> Any:
    """An ``MlflowClient`` of ``uri``. Opening a SQLite store creates or upgrades its tables,
    and processes doing that at once (runs started together in a new folder) left the
    database broken for all of them; here they take turns, under a lock on its folder."""
    import mlflow
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError:  # a server or file store: nothing to create here
        return mlflow.MlflowClient(tracking_uri=uri)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return mlflow.MlflowClient(tracking_uri=uri)
    folder = os.open(Path(url.database).resolve().parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        return mlflow.MlflowClient(tracking_uri=uri)
    finally:
        os.close(folder)  # and the lock with it


def use_mlflow_defaults() -> None:
    """rlspeed's MLflow settings (``_MLFLOW_DEFAULTS``, unless the user set them) in this
    process, before MLflow is used: a dead server costs seconds, not minutes of retries."""
    for name, value in _MLFLOW_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # urllib3 logs each retry; a server that stopped answering gets rlspeed's one line.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def _portable(uri: str) -> str:
    """``uri`` as it works from any folder and can be shown: a relative SQLite file or file
    store made absolute, a database server's password hidden."""
    scheme = urllib.parse.urlparse(uri).scheme.lower()
    if scheme.partition("+")[0] not in _DATABASES:  # a file store: a path or file:PATH
        path = urllib.parse.urlparse(uri).path if scheme == "file" else uri
        return str(Path(path).resolve())
    from sqlalchemy.engine import make_url

    url = make_url(uri)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None  # check() admits only a SQLite store with a file
        url = url.set(database=str(Path(url.database).resolve()))
    return url.render_as_string(hide_password=True)


# The kind of experiment rlspeed's are: model training, not GenAI (traces, prompts). Earlier
# MLflow 3 UIs chose an experiment's view by this tag; 3.17's has one switch for all of them
# (the URL's workflowType, else the browser's last choice, else GenAI), so rlspeed's links
# carry ?workflowType=machine_learning (MlflowStore.links) as well.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its runs' files: beside a SQLite store's file (its
    ``mlruns/``), not in whatever folder the process runs in (MLflow's default); None, the
    store's own default, for a server or another database."""
    from sqlalchemy.engine import make_url

    if urllib.parse.urlparse(uri).scheme.lower() != "sqlite":
        return None
    database = make_url(uri).database
    if not database or database == ":memory:":
        return None
    return str(Path(database).resolve().parent / "mlruns")


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment ``name``, created if there is none (its files beside a SQLite
    store: ``artifact_root``), tagged EXPERIMENT_KIND (unless the user gave it a kind of
    their own)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            root = artifact_root(client.tracking_uri)
            # A folder per experiment, named after it (MLflow's default names it by its id,
            # which is not known before it is created).
            folder = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "experiment"
            location = None if root is None else f"{root}/{folder}"
            return client.create_experiment(name, location, tags=EXPERIMENT_KIND)
        except MlflowException:  # created meanwhile by a run started beside this one
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if not EXPERIMENT_KIND.keys() & experiment.tags.keys():  # made before rlspeed tagged
        for key, value in EXPERIMENT_KIND.items():
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


def run_links(uri: str, experiment: str, run_id: str) -> dict[str, str]:
    """Where to see a run: its page on the MLflow server; for a local or database store,
    the ``mlflow ui`` command that serves it and the run's page there."""
    # MLflow 3 opens a run's page on its GenAI view unless the URL asks for the classic one.
    page = f"#/experiments/{experiment}/runs/{run_id}?workflowType=machine_learning"
    scheme = urllib.parse.urlparse(uri).scheme.lower()
    if scheme in ("http", "https"):
        return {"MLflow run": f"{uri.rstrip('/')}/{page}"}
    if scheme == "databricks":
        return {}
    ui = f"mlflow ui --backend-store-uri {_portable(uri)}"
    return {"MLflow UI": ui, "MLflow run": f"http://127.0.0.1:5000/{page} (with mlflow ui)"}


class MlflowStore:
    """One run in MLflow, driven by the tracking writer process (``rlspeed.tracking._writer``):
    it is made there, so MLflow's import and store opening overlap compilation and
    training. Every call raises on failure; the writer holds what failed and tries again."""

    def __init__(self, cfg: SimpleNamespace) -> None:
        use_mlflow_defaults()
        import mlflow
        from mlflow.exceptions import MlflowException
        from sqlalchemy.exc import SQLAlchemyError

        # What a store that stopped answering raises: requests' errors are OSErrors, and a
        # database store can raise SQLAlchemy's own (a file that is not a database).
        self.errors = (MlflowException, OSError, SQLAlchemyError)
        self._uri = resolve_uri(cfg) or mlflow.get_tracking_uri()
        # The client API, not the fluent one: no run is "active" in this process, so no exit
        # hook ends it behind rlspeed's back and the thread that writes does not matter.
        self._client = mlflow_client(self._uri)
        self._experiment = cfg.experiment
        self._experiment_id: str | None = None
        self._parent_run_id = cfg.parent_run_id
        self._out_dir = Path(cfg.out_dir)
        self._params_logged = False
        self.run_id: str | None = None

    def start(
        self, run_name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None
    ) -> None:
        from mlflow.entities import Param

        client = self._client
        if self._experiment_id is None:
            self._experiment_id = experiment_id(client, self._experiment)
        if self._parent_run_id:
            # Nested under a study's parent run that may live in another process: the tag
            # alone is what MLflow uses to nest runs.
            tags = {**tags, "mlflow.parentRunId": self._parent_run_id}
        if run_id is not None:  # continued: its params are those it was started with
            client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            self._params_logged = True
        elif self.run_id is None:  # a start tried again reuses the run its first try created
            self.run_id = client.create_run(self._experiment_id, run_name=run_name).info.run_id
        run_params = [Param(key, value[:_MAX_PARAM_LENGTH]) for key, value in params.items()]
        client.log_batch(self.run_id, params=[] if self._params_logged else run_params)
        self._params_logged = True
        self.set_tags({key: str(value) for key, value in tags.items()})

    def log_rows(self, rows: list[Row]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(key, float(value), row.timestamp_ms, row.step)
            for row in rows
            for key, value in row.metrics.items()
        ]
        self._client.log_batch(self.run_id, metrics=metrics)

    def log_artifact(self, path: Path) -> None:
        folder = artifact_folder(path, self._out_dir)  # videos/ as in the run folder
        self._client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def end(self, status: str) -> None:
        if self.run_id is not None:
            self._client.set_terminated(self.run_id, status)

    def links(self) -> dict[str, str]:
        if self.run_id is None or self._experiment_id is None:
            return {}
        return run_links(self._uri, self._experiment_id, self.run_id)

    def lost(self, error: BaseException) -> str:
        # Recorded in metrics.json and shown: a database URI's password masked.
        where = mask(self._uri)
        if urllib.parse.urlparse(self._uri).scheme in ("http", "https"):
            return f"the MLflow server at {where} stopped answering ({cause(error)})"
        return f"the MLflow store at {where} failed ({cause(error)})"


# What a writer would otherwise import after its fork to open a database store: SQLAlchemy,
# Alembic and MLflow's SQL store, ~380 modules and about 1 s of CPU per writer, which a batch
# of 40 trials paid at once (most of its writers' time). Names differ between MLflow versions;
# one this version lacks is skipped (it would be imported where needed, if at all).
_WRITER_MODULES = (
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.tracking.sqlalchemy_workspace_store",
    "mlflow.store.tracking.file_store",
    "mlflow.protos.internal_pb2",
    "sqlalchemy.dialects.sqlite",
    "alembic.command",
    "alembic.config",
)


def preload() -> None:
    """What the tracking writers' zygote loads once for all of them (``_writer``)."""
    use_mlflow_defaults()
    import mlflow.tracking  # noqa: F401

    for name in _WRITER_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def make_store(cfg: SimpleNamespace) -> MlflowStore:
    """The store the tracking writer process drives (``rlspeed.tracking._writer``)."""
    return MlflowStore(cfg)


def make_tracker(cfg: DictConfig, out_dir: Path) -> WriterProcess:
    """The run's tracker: MLflow written by a process of its own, off training's path; a
    server's user and password go to it in its environment (server_credentials)."""
    uri, credentials = server_credentials(resolve_uri(cfg))
    settings = {"uri": uri, "experiment": cfg.experiment, "parent_run_id": cfg.parent_run_id}
    settings["out_dir"] = str(out_dir.resolve())
    return WriterProcess(__name__, settings, env=credentials)


SPEC = TrackerSpec(name="mlflow", make=make_tracker, check=check)
