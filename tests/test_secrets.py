"""Passwords in URLs are never printed, logged, written to files or sent to MLflow or Optuna,
and an MLflow server's ``http://user:password@host`` URI works (SPEC, Reliability: security).

Refusals run the real command; a run and a sweep record to a real ``mlflow server`` on
loopback through a URI with a password, and then every file they left is searched for it.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from rlspeed.config_tree import flatten, to_yaml
from rlspeed.errors import ConfigError, RLSpeedError
from rlspeed.registry import TASKS
from rlspeed.secrets import (
    PASSWORDS_VARIABLE,
    hide_in_arguments,
    mask,
    mask_value,
    reveal,
    split_credentials,
)
from rlspeed.sweep import open_storage
from rlspeed.tracking._writer import WriterZygote
from rlspeed.tracking.mlflow import make_tracker, server_credentials
from rlspeed.validation import check
from tests.conftest import SMALL, assert_one_line_error, free_port, run_cli
from tests.test_tracking import mlflow_server

PASSWORD = "secret"

# A tiny Optuna sweep: tabular Q-learning on GridWorld, a few hundred steps per trial.
SWEEP = [
    "-m", "hydra/sweeper=optuna", "algo.alpha=interval(0.1, 0.9)", "algo=qlearn",
    "task=gridworld", "backend=torch", "env=gym-sync", "num_envs=1", "total_steps=500",
    "log_every=250", "eval_every=250", "progress=plain",
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://user:secret@127.0.0.1:1/db", "postgresql://user:***@127.0.0.1:1/db"),
        ("postgresql+psycopg://u:p%40ss@h/db", "postgresql+psycopg://u:***@h/db"),
        ("https://u:p@ss@host/x?a=b", "https://u:***@host/x?a=b"),  # a raw @ in the password
        ("uri='http://u:pw@h:5000': refused", "uri='http://u:***@h:5000': refused"),
        ("a http://u:1@h b https://v:2@k", "a http://u:***@h b https://v:***@k"),
        (r"#0 : tracking.uri=http\://u\:pw@h\:1", r"#0 : tracking.uri=http\://u\:***@h\:1"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),  # no password
        ("http://host:5000/path", "http://host:5000/path"),
        ("sqlite:////tmp/x.db and user:pw@host", "sqlite:////tmp/x.db and user:pw@host"),
    ],
)
def test_mask_hides_every_password_in_a_string(text, masked):
    assert mask(text) == masked


def test_mask_value_and_split_credentials():
    value = {"uri": "http://u:secret@h", "list": ["mysql://a:secret@b/c", 3], "n": None}
    masked = {"uri": "http://u:***@h", "list": ["mysql://a:***@b/c", 3], "n": None}
    assert mask_value(value) == masked
    assert split_credentials("https://u%40x:p%3Aw@host:8/p") == ("https://host:8/p", "u@x", "p:w")
    assert split_credentials("https://host:8/p") == ("https://host:8/p", None, None)


def test_passwords_taken_off_the_command_line_come_back_where_a_process_connects(monkeypatch):
    monkeypatch.delenv(PASSWORDS_VARIABLE, raising=False)
    arguments = [
        f"tracking.uri=http://user:{PASSWORD}@mlflow:5000",
        f"hydra.sweeper.storage=postgresql://rl:p@{PASSWORD}@db:5432/optuna",
        "seed=1",
    ]
    hidden = hide_in_arguments(arguments)
    assert hidden == [
        "tracking.uri=http://user:***@mlflow:5000",
        "hydra.sweeper.storage=postgresql://rl:***@db:5432/optuna",
        "seed=1",
    ]
    # As the sweeper hands the storage to its jobs (with psycopg's driver) and MLflow gets it.
    assert reveal("postgresql+psycopg://rl:***@db:5432/optuna") == (
        f"postgresql+psycopg://rl:p@{PASSWORD}@db:5432/optuna"
    )
    assert reveal("http://user:***@mlflow:5000") == f"http://user:{PASSWORD}@mlflow:5000"
    assert reveal("http://other:***@mlflow:5000") == "http://other:***@mlflow:5000"  # not given


@contextlib.contextmanager
def server_wanting(user: str, password: str) -> Iterator[str]:
    """A loopback HTTP server that answers 401 unless a request carries ``user`` and
    ``password`` (basic auth), and 503 when it does; yields its URL's ``host:port``."""
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            authorized = self.headers.get("Authorization") == expected
            self.send_response(503 if authorized else 401)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_password_hidden_from_hydra_still_reaches_the_server(tmp_path):
    with server_wanting("user", PASSWORD) as address:
        result = run_cli([f"tracking.uri=http://user:{PASSWORD}@{address}"], cwd=tmp_path)
    # 503 (Service Unavailable), not 401: the server got the user and password; the line
    # shows neither.
    refused = f"invalid tracking.uri=http://user:***@{address}"
    assert_one_line_error(result, refused, "Service Unavailable")
    assert PASSWORD not in result.stdout + result.stderr
    assert not (tmp_path / "outputs").exists()


def test_errors_never_hold_a_password():
    # Cut to a readable length after masking: the cut URL would no longer be recognized.
    long_uri = f"postgresql://user:{PASSWORD}@{'db.example.org' * 5}:5432/optuna"
    error = ConfigError("hydra.sweeper.storage", long_uri, f"a server that answers ({long_uri})")
    assert PASSWORD not in str(error) and "user:***@" in str(error)
    assert PASSWORD not in str(error.__reduce__())  # what a joblib job sends back
    assert PASSWORD not in str(RLSpeedError(f"rlspeed: study in {long_uri} failed"))


def test_config_yaml_and_mlflow_params_are_masked(make_cfg):
    uri = f"http://user:{PASSWORD}@127.0.0.1:5000"
    cfg = make_cfg([f"tracking.uri={uri}"])
    assert PASSWORD not in to_yaml(cfg)
    assert flatten(cfg)["tracking.uri"] == "http://user:***@127.0.0.1:5000"


def test_server_credentials_go_to_mlflow_variables_not_the_writer_command_line(make_cfg):
    uri, variables = server_credentials(f"https://user:{PASSWORD}@mlflow.example.org/prefix")
    assert uri == "https://mlflow.example.org/prefix"
    assert variables == {"MLFLOW_TRACKING_USERNAME": "user", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    database = f"postgresql://user:{PASSWORD}@db/mlflow"
    assert server_credentials(database) == (database, {})  # libpq takes it from the URL
    # The writer's command line is visible to every user (ps): no settings on it.
    for tracking_uri in (f"http://user:{PASSWORD}@127.0.0.1:1", database):
        tracker = make_tracker(make_cfg([f"tracking.uri={tracking_uri}"]).tracking, Path("run"))
        command = WriterZygote.command(tracker._module, 3)
        assert all(PASSWORD not in arg for arg in command)


@pytest.mark.parametrize(
    ("args", "env", "fragments"),
    [
        (
            [f"tracking.uri=postgresql://user:{PASSWORD}@127.0.0.1:1/mlflow"],
            {},
            ["invalid tracking.uri=postgresql://user:***@127.0.0.1:1/mlflow", "answers"],
        ),
        (
            [],
            {"MLFLOW_TRACKING_URI": f"http://user:{PASSWORD}@127.0.0.1:{{port}}"},
            ["invalid MLFLOW_TRACKING_URI=http://user:***@127.0.0.1:", "Connection refused"],
        ),
        (
            [*SWEEP, f"hydra.sweeper.storage=postgresql://user:{PASSWORD}@127.0.0.1:1/db"],
            {},
            ["invalid hydra.sweeper.storage=postgresql://user:***@127.0.0.1:1/db"],
        ),
    ],
    ids=["tracking.uri", "MLFLOW_TRACKING_URI", "hydra.sweeper.storage"],
)
def test_a_refused_url_shows_its_password_masked(tmp_path, args, env, fragments):
    env = {key: value.format(port=free_port()) for key, value in env.items()}
    result = run_cli(args, cwd=tmp_path, env=env)
    # An HTTP URI with user:password@ is tried as a server (no "Name or service not known").
    assert_one_line_error(result, *fragments)
    assert PASSWORD not in result.stdout + result.stderr


def test_hydra_shows_the_config_with_the_password_masked(tmp_path):
    uri = f"postgresql://user:{PASSWORD}@127.0.0.1:1/mlflow"
    result = run_cli(["--cfg", "job", "tracking=none", f"tracking.uri={uri}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "uri: postgresql://user:***@127.0.0.1:1/mlflow" in result.stdout
    assert PASSWORD not in result.stdout + result.stderr


def _files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def _assert_no_password_in_mlflow(client: MlflowClient, run) -> None:
    run = client.get_run(run.info.run_id)
    for key, value in {**run.data.params, **run.data.tags}.items():
        assert PASSWORD not in value, key


@pytest.mark.slow
def test_a_run_reaches_a_server_through_user_and_password_and_stores_neither(tmp_path):
    """A run, then a grid sweep of one job (Hydra's basic sweeper writes multirun.yaml)."""
    args = [*SMALL, "total_steps=2000", "backend=torch", "env=gym-sync", "num_envs=2"]
    with mlflow_server(tmp_path) as (_, uri):
        port = uri.rsplit(":", 1)[1]
        secret_uri = f"http://user:{PASSWORD}@127.0.0.1:{port}"
        result = run_cli([*args, f"tracking.uri={secret_uri}"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("rlspeed")
        (run,) = client.search_runs([experiment.experiment_id])
        assert run.info.status == "FINISHED" and "eval/score" in run.data.metrics
        assert run.data.params["tracking.uri"] == f"http://user:***@127.0.0.1:{port}"
        _assert_no_password_in_mlflow(client, run)
        # Linked without the user and password.
        assert f"{uri}/#/experiments/{experiment.experiment_id}/runs/" in result.stdout
        swept = run_cli(["-m", "seed=2", *args, f"tracking.uri={secret_uri}"], cwd=tmp_path)
        assert swept.returncode == 0, swept.stderr[-3000:]
        runs = client.search_runs([experiment.experiment_id])
        assert len(runs) == 2
        for run in runs:
            _assert_no_password_in_mlflow(client, run)
    for shown in (result, swept):
        assert PASSWORD not in shown.stdout + shown.stderr
    run_dir = next((tmp_path / "outputs").glob("20*/*"))
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()
    assert (run_dir / "rlspeed.log").is_file()
    assert len(list((tmp_path / "outputs" / "multirun").glob("*/*/multirun.yaml"))) == 1
    assert _files_holding(tmp_path / "outputs", PASSWORD) == []
    assert _files_holding(tmp_path / "mlartifacts", PASSWORD) == []  # the server's copies


@pytest.mark.slow
def test_a_sweep_records_no_password_in_its_study_folders_or_mlflow(tmp_path):
    with mlflow_server(tmp_path) as (_, uri):
        secret_uri = uri.replace("http://", f"http://user:{PASSWORD}@")
        args = [*SWEEP, "hydra.sweeper.n_trials=2", f"tracking.uri={secret_uri}"]
        result = run_cli(args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("rlspeed")
        runs = client.search_runs([experiment.experiment_id])
        assert len(runs) == 3  # the study's parent run and one per trial
        for run in runs:
            _assert_no_password_in_mlflow(client, run)
    assert PASSWORD not in result.stdout + result.stderr
    journal = tmp_path / "outputs" / "optuna" / "qlearn_gridworld.journal"
    storage = open_storage(str(journal))
    study = optuna.load_study(study_name="qlearn_gridworld", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    recorded = [storage.get_study_system_attrs(study._study_id), study.user_attrs]
    recorded += [(t.user_attrs, t.system_attrs, t.params) for t in study.trials]
    assert PASSWORD not in str(recorded)
    # Every file: the sweep's multirun.yaml and results, each trial's .hydra/, config.yaml,
    # rlspeed.log and metrics.json, the study's journal.
    assert _files_holding(tmp_path / "outputs", PASSWORD) == []


@pytest.mark.slow
def test_submitit_job_files_hold_no_password(tmp_path):
    """hydra/launcher=submitit_local pickles the launcher's config and each job's overrides
    and result (as submitit_slurm does) in the sweep's .submitit/ folder."""
    uri = f"http://user:{PASSWORD}@127.0.0.1:1"  # tracking=none: not connected to
    args = [*SWEEP, "hydra/launcher=submitit_local", "hydra.sweeper.n_trials=1"]
    result = run_cli([*args, "tracking=none", f"tracking.uri={uri}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    pickles = list((tmp_path / "outputs" / "multirun").glob("*/*/.submitit/*/*.pkl"))
    assert {p.name.split("_", 1)[1] for p in pickles} == {"submitted.pkl", "0_result.pkl"}
    assert b"user:***@127.0.0.1:1" in pickles[0].read_bytes() + pickles[1].read_bytes()
    assert _files_holding(tmp_path / "outputs", PASSWORD) == []
    assert PASSWORD not in result.stdout + result.stderr


# task=gym's hostile/Url-v0 is made only with the URL's password (tests/data/hostile_envs.py).
URL_ENV = [
    "task=gym", "task.import=tests.data.hostile_envs", "task.id=hostile/Url-v0",
    f"+task.kwargs.url=https://user:{PASSWORD}@host/x", "algo=qlearn", "backend=torch",
    "env=gym-async", "num_envs=2", "log_every=200", "eval_every=200", "progress=plain",
]  # fmt: skip


def test_a_password_in_task_kwargs_reaches_the_env_and_no_output(tmp_path):
    """In the main process and every gym-async worker; the console, rlspeed.log,
    config.yaml and metrics.json show it masked."""
    run_dir = tmp_path / "run"
    args = [*URL_ENV, "total_steps=400", "tracking=none", f"hydra.run.dir={run_dir}"]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert PASSWORD not in result.stdout + result.stderr
    assert "url: https://user:***@host/x" in (run_dir / "config.yaml").read_text()
    assert {"rlspeed.log", "metrics.json"} <= {p.name for p in run_dir.iterdir()}
    assert _files_holding(tmp_path, PASSWORD) == []


def test_a_masked_password_in_task_kwargs_is_refused_unless_given(make_cfg, monkeypatch):
    """A saved config.yaml holds ***: the env gets the password only from this process."""
    monkeypatch.delenv(PASSWORDS_VARIABLE, raising=False)
    given = [arg for arg in URL_ENV if not arg.startswith("+task.kwargs.url")]
    masked = make_cfg([*given, "+task.kwargs.url=https://user:***@host/x"])
    with pytest.raises(ConfigError) as refused:
        check(masked)
    assert str(refused.value) == (
        "rlspeed: invalid task.kwargs.url=https://user:***@host/x: expected a URL with "
        "user@host's password, which rlspeed keeps only as *** (in config.yaml too): give it "
        "again on the command line or in RLSPEED_URL_PASSWORDS (README, Passwords)"
    )
    monkeypatch.setenv(PASSWORDS_VARIABLE, json.dumps({"user@host": PASSWORD}))
    env = TASKS.get("gym").make_env(check(masked).cfg.task)
    assert env.unwrapped.url == f"https://user:{PASSWORD}@host/x"
    env.close()


@pytest.mark.slow
def test_a_run_with_a_password_in_task_kwargs_records_none_to_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_cli([*URL_ENV, f"tracking.uri={uri}", "total_steps=400"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("rlspeed").experiment_id])
    assert run.data.params["task.kwargs.url"] == "https://user:***@host/x"
    _assert_no_password_in_mlflow(client, run)
    assert PASSWORD not in result.stdout + result.stderr
    # MLflow's schema has a column named "secret" (its webhooks'): the store is read above.
    assert [p for p in _files_holding(tmp_path, PASSWORD) if p.name != "mlflow.db"] == []
