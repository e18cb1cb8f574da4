"""MLflow records every run: params, metrics, tags, artifacts and the real end status."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlspeed.tracking._environment import environment_tags
from tests.conftest import REPO_ROOT, SMALL, free_port, run_cli, start_cli


def _only_run(uri: str):
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rlspeed")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def logged_metrics(out_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every row of the run's ``metrics.json`` as a tracker gets it: name -> [(step, value)]
    (each seed's as ``seed<i>/<name>``)."""
    metrics = json.loads((out_dir / "metrics.json").read_text())
    streams = [("", metrics["history"])]
    streams += [(f"seed{i}/", seed["history"]) for i, seed in enumerate(metrics.get("seeds", []))]
    expected: dict[str, list[tuple[int, float]]] = {}
    for prefix, rows in streams:
        for row in rows:
            for name, value in row.items():
                if name != "step":
                    expected.setdefault(prefix + name, []).append((int(row["step"]), value))
    return expected


def assert_every_row_in_mlflow(client: MlflowClient, run_id: str, out_dir: Path) -> int:
    """Every row of the run's ``metrics.json`` is in the MLflow run, and MLflow holds no
    other; returns how many values that is."""
    expected = logged_metrics(out_dir)
    run = client.get_run(run_id)
    assert set(run.data.metrics) == set(expected)
    for name, values in expected.items():
        recorded = [(m.step, m.value) for m in client.get_metric_history(run_id, name)]
        assert sorted(recorded) == sorted(values), name
    return sum(map(len, expected.values()))


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_finished_run_has_params_metrics_tags_and_artifacts(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_cli([*SMALL, f"tracking.uri={uri}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    client, run = _only_run(uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags["backend"] == "flax" and run.data.tags["env"] == "jax-vmap"
    assert run.data.tags["algo"] == "dqn" and run.data.tags["task"] == "doors"
    assert run.data.params["algo.learning_rate"] == "0.0003"
    assert run.data.params["num_envs"] == "128"
    for name in ("eval/score", "charts/episodic_return", "charts/SPS", "losses/td_loss"):
        assert name in run.data.metrics, name
    history = client.get_metric_history(run.info.run_id, "charts/SPS")
    assert [m.step for m in history] == sorted(m.step for m in history) and len(history) >= 4
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "checkpoint.msgpack", "learning_curve.png", "metrics.json"} <= artifacts
    # The local output folder holds the same files, and metrics.json agrees with MLflow.
    out_dir = next((tmp_path / "outputs").glob("*/*"))
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["score"] == run.data.metrics["eval/score"]
    assert metrics["status"] == "FINISHED" and metrics["env_steps"] >= 4000
    assert assert_every_row_in_mlflow(client, run.info.run_id, out_dir) >= 4 * 5
    # What the run ran on, and MLflow 3's UI opens the experiment in its training view.
    tags = run.data.tags
    assert tags["rlspeed.version"] == importlib.metadata.version("rlspeed")
    for library in ("jax", "flax", "torch", "gymnasium", "mlflow", "optuna"):
        assert tags[f"rlspeed.version.{library}"] == importlib.metadata.version(library)
    assert tags["rlspeed.host"] == socket.gethostname()
    assert tags["rlspeed.cpu"]
    assert tags["rlspeed.command"].endswith(shlex.join([*SMALL, f"tracking.uri={uri}"]))
    checkout = subprocess.run(
        ["git", "-C", REPO_ROOT, "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if checkout.returncode == 0:  # a source checkout (not an installed wheel)
        assert tags["rlspeed.git_commit"] == checkout.stdout.strip()
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_command_line_tag_masks_a_password():
    """The command line a run is tagged with holds no password of a URL in it."""
    secret = "s3cret-Pw"
    tags = environment_tags(["rlspeed", f"hydra.sweeper.storage=postgresql://u:{secret}@db/x"])
    assert secret not in tags["rlspeed.command"]
    assert "postgresql://u:***@db/x" in tags["rlspeed.command"]


# A writer, forked from a zygote that has run preload(), records a run in a new SQLite store
# and reports which modules it had to import for that.
_WRITER_IMPORTS = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
from rlspeed.tracking import mlflow as tracking
from rlspeed.tracking._store_writer import Row
tracking.preload()
before = set(sys.modules)
out_dir = str(Path(sys.argv[2]).parent)
settings = SimpleNamespace(uri=sys.argv[1], experiment="rlspeed", parent_run_id=None)
settings.out_dir = out_dir
store = tracking.make_store(settings)
store.start("run", {"algo.gamma": "0.9"}, {"tag": "x"}, None)
store.log_rows([Row({"return": 1.0}, 10, int(time.time() * 1000))])
store.log_artifact(Path(sys.argv[2]))
store.end("FINISHED")
print(" ".join(sorted(set(sys.modules) - before)))
"""


@pytest.mark.slow  # 7 s on 2 cores: a fresh interpreter imports MLflow's store
def test_the_writers_zygote_preloads_what_a_writer_imports_for_a_sqlite_store(tmp_path):
    """Each run's writer is forked from a zygote that loaded MLflow's database store once: a
    batch of trials starts its writers together, and one that imported SQLAlchemy, Alembic
    and MLflow's SQL store itself (~380 modules) cost ~1 s of CPU each, most of a 40-trial
    batch's tracking time."""
    artifact = tmp_path / "config.yaml"
    artifact.write_text("a: 1\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _WRITER_IMPORTS, uri, str(artifact)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    imported = done.stdout.split()
    heavy = [name for name in imported if name.partition(".")[0] in ("sqlalchemy", "alembic")]
    assert not heavy and len(imported) < 40, imported
    assert _only_run(uri)[1].info.status == "FINISHED"


def test_a_writer_whose_run_is_gone_before_its_answer_still_ends_the_run_killed(tmp_path):
    """A run killed outright before its writer could answer it (the writer still starting):
    the answer has nowhere to go, and the writer still writes what it was given and ends the
    MLflow run KILLED, as it does for a run killed later."""
    from rlspeed.tracking._writer import WriterZygote
    from rlspeed.tracking.mlflow import mlflow_client

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    zygote = WriterZygote("rlspeed.tracking.mlflow")
    try:
        to_writer, from_writer = zygote.spawn({})
        from_writer.close()  # the run is gone: no answer reaches it
        start = {"run_name": "r", "params": {}, "tags": {}, "run_id": None, "command": ["x"]}
        for message in (
            {"uri": uri, "experiment": "e", "parent_run_id": None, "out_dir": str(tmp_path)},
            {"start": start},
            {"rows": [[{"loss": 0.5}, 10, 1_000]]},
        ):
            to_writer.write(json.dumps(message) + "\n")
        to_writer.close()
        client = mlflow_client(uri)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(0.5)
            experiment = client.get_experiment_by_name("e")
            runs = client.search_runs([experiment.experiment_id]) if experiment else []
            if runs and runs[0].info.status != "RUNNING":
                break
        assert [run.info.status for run in runs] == ["KILLED"]
        assert runs[0].data.metrics == {"loss": 0.5}
    finally:
        zygote.control.close()
        zygote.process.wait(timeout=30)


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``log_dir``: name -> [(step, value)]."""
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        name: [(e.step, e.value) for e in events.Scalars(name)] for name in events.Tags()["scalars"]
    }


def assert_every_row_in_tensorboard(out_dir: Path, log_dir: Path) -> int:
    """Every row of the run's ``metrics.json`` is in the event files of ``log_dir``, at its
    step, and they hold no other; returns how many values that is."""
    expected = logged_metrics(out_dir)
    recorded = tensorboard_scalars(log_dir)
    assert set(recorded) == set(expected)
    for name, values in expected.items():
        assert [step for step, _ in recorded[name]] == [step for step, _ in values], name
        # TensorBoard keeps float32.
        assert [v for _, v in recorded[name]] == pytest.approx([v for _, v in values]), name
    return sum(map(len, expected.values()))


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_tensorboard_run_writes_every_row_of_metrics_json(tmp_path):
    """tracking=tensorboard: the event files hold each metric of metrics.json (each seed's as
    seed<i>/<name>, as in MLflow), at the same steps, and nothing else; the params and tags
    as text; the summary says how to open them."""
    args = ["algo=qlearn", "task=gridworld", "backend=torch", "env=gym-sync", "num_envs=1"]
    args += ["total_steps=2000", "log_every=500", "eval_every=1000", "num_seeds=2"]
    result = run_cli([*args, "tracking=tensorboard", "progress=none"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (out_dir,) = (tmp_path / "outputs").glob("*/*")
    log_dir = out_dir / "tensorboard"
    assert f"tensorboard --logdir {log_dir}" in result.stdout
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["mlflow_run_id"] is None and metrics["errors"] == []
    assert "seed1/eval/score" in tensorboard_scalars(log_dir)
    assert assert_every_row_in_tensorboard(out_dir, log_dir) >= 4 * 10
    text = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    text.Reload()
    config = text.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "| algo.name | qlearn |" in config and "| num_seeds | 2 |" in config
    assert text.Tensors("status")[-1].tensor_proto.string_val == [b"FINISHED"]
    assert "_hparams_/session_start_info" in text.Tags()["tensors"]


@pytest.mark.slow
def test_tensorboard_log_dir_given_keeps_each_run_in_a_folder_of_its_own(tmp_path):
    """tracking.log_dir=DIR: runs write to DIR/<date>/<run folder's name>, one folder each."""
    args = ["algo=qlearn", "task=gridworld", "backend=torch", "env=gym-sync", "num_envs=1"]
    args += ["total_steps=400", "log_every=200", "eval_every=400", "progress=none"]
    args += ["tracking=tensorboard", f"tracking.log_dir={tmp_path}/tb"]
    for index in range(2):
        result = run_cli([*args, f"hydra.run.dir=runs/run{index}"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    for index in range(2):
        recorded = tensorboard_scalars(tmp_path / "tb" / "runs" / f"run{index}")
        assert [step for step, _ in recorded["eval/score"]] == [400]
    assert not (tmp_path / "runs" / "run0" / "tensorboard").exists()


@pytest.mark.slow
def test_runs_started_together_in_a_new_folder_share_one_new_store(tmp_path):
    """Four runs create the same new SQLite store at once: MLflow creates and upgrades its
    tables as it opens a store, and runs doing that together broke it for all of them."""
    uri = f"sqlite:///{tmp_path}/new.db"
    args = ["algo=qlearn", "task=gridworld", "backend=torch", "env=gym-sync", "num_envs=1"]
    args += ["total_steps=500", f"tracking.uri={uri}", "progress=none"]
    runs = [start_cli([*args, f"hydra.run.dir={tmp_path}/run{i}"], tmp_path) for i in range(4)]
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("rlspeed")
    found = client.search_runs([experiment.experiment_id])
    assert [r.info.status for r in found] == ["FINISHED"] * 4
    assert all("eval/score" in r.data.metrics for r in found)


@pytest.mark.slow
def test_mlflow_tracking_uri_environment_variable_is_honoured(tmp_path):
    uri = f"sqlite:///{tmp_path}/from_env.db"
    args = [*SMALL, "total_steps=1000", "backend=torch", "env=gym-sync", "num_envs=2"]
    result = run_cli(args, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr
    _, run = _only_run(uri)
    assert run.info.status == "FINISHED" and run.data.tags["backend"] == "torch"


@pytest.mark.slow
def test_diverging_run_is_failed_and_keeps_what_was_recorded(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*SMALL, "algo.learning_rate=1e30", "algo.learning_starts=1500", f"tracking.uri={uri}"]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode != 0
    assert "training diverged: losses/td_loss" in result.stderr
    assert "Traceback" not in result.stderr
    client, run = _only_run(uri)
    assert run.info.status == "FAILED"
    # The metrics logged before the divergence are kept.
    history = client.get_metric_history(run.info.run_id, "charts/SPS")
    assert len(history) >= 1 and history[0].step == 1024
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "checkpoint.msgpack", "metrics.json"} <= artifacts


@contextlib.contextmanager
def mlflow_server(
    tmp_path: Path, port: int | None = None
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A real `mlflow server` on loopback with a store of its own in ``tmp_path`` (on
    ``port``, or a free one); yields (process, URI). It runs in a session of its own:
    killing that session ends its workers too."""
    port = port or free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/server.db",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        yield server, uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.slow
def test_run_logged_to_a_real_mlflow_server(tmp_path):
    """tracking.uri=http://...: a real `mlflow server` on loopback stores and serves the run."""
    with mlflow_server(tmp_path) as (_, uri):
        result = run_cli([*SMALL, "total_steps=2000", f"tracking.uri={uri}"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        client, run = _only_run(uri)
        assert run.info.status == "FINISHED"
        assert "eval/score" in run.data.metrics
        # The summary links the run's page (MLflow 3 opens on its GenAI view without the query).
        page = f"{uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        assert f"{page}?workflowType=machine_learning" in result.stdout
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "checkpoint.msgpack", "metrics.json"} <= artifacts
        with urllib.request.urlopen(f"{uri}/", timeout=10) as page:  # the UI itself answers
            assert page.status == 200


@pytest.mark.slow
def test_tensorboard_sweep_writes_each_trial_in_its_own_folder(tmp_path):
    """tracking=tensorboard in a sweep whose trials train two at a time as one program: each
    trial's event files are in its own folder and hold its own rows, all of them."""
    args = ["-m", "hparams=qlearn_search", "hydra.sweeper.n_trials=4"]
    args += ["hydra.sweeper.batch_size=2", "total_steps=20000", "log_every=5000"]
    args += ["eval_every=10000", "hydra.sweeper.report_every=10000", "progress=none"]
    result = run_cli([*args, "tracking=tensorboard"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = sorted((tmp_path / "outputs" / "multirun").glob("*/*/*_flax_jax-vmap_qlearn_doors"))
    assert len(trials) == 4
    scores = set()
    for trial in trials:
        assert assert_every_row_in_tensorboard(trial, trial / "tensorboard") >= 4 * 4
        scores.add(tuple(tensorboard_scalars(trial / "tensorboard")["charts/epsilon"]))
    assert len(scores) == 4  # each its own exploration schedule, not another trial's rows


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"mode": "cloud"}, "tracking.mode=cloud: expected null (W&B's default), online, offline"),
        ({"project": "team/runs"}, "tracking.project=team/runs: expected a W&B project name of"),
        ({"entity": ""}, "tracking.entity=: expected a W&B entity (a user or team) name of 1 to"),
        ({"tags": ["t" * 65]}, "expected tags of 1 to 64 characters (W&B's)"),
        ({"group": "g" * 129}, "expected a group of 1 to 128 characters"),
    ],
)
def test_wandb_settings_w_and_b_would_refuse_are_one_line(settings, line):
    """tracking=wandb's settings are checked before anything is created, wandb installed or
    not (tests/test_wandb.py runs W&B itself, with the wandb extra)."""
    from omegaconf import OmegaConf

    from rlspeed.config import TrackingConfig
    from rlspeed.errors import ConfigError
    from rlspeed.tracking.wandb import check

    cfg = OmegaConf.structured(TrackingConfig(name="wandb", **settings))
    with pytest.raises(ConfigError) as refused:
        check(cfg)
    assert line in str(refused.value) and str(refused.value).startswith("rlspeed: invalid ")


def test_tracking_wandb_without_wandb_says_how_to_install_it(monkeypatch):
    from omegaconf import OmegaConf

    from rlspeed.config import TrackingConfig
    from rlspeed.errors import ConfigError
    from rlspeed.tracking.wandb import check

    monkeypatch.setitem(sys.modules, "wandb", None)  # as where the extra is not installed
    with pytest.raises(ConfigError) as refused:
        check(OmegaConf.structured(TrackingConfig(name="wandb", mode="offline")))
    assert str(refused.value) == (
        'rlspeed: invalid tracking=wandb: expected an installed wandb: pip install "rlspeed[wandb]"'
    )


def test_wandb_variables_stand_in_for_null_settings_and_are_checked_alike(monkeypatch):
    from omegaconf import OmegaConf

    from rlspeed.config import TrackingConfig
    from rlspeed.errors import ConfigError
    from rlspeed.tracking.wandb import check, project, wandb_dir

    cfg = OmegaConf.structured(TrackingConfig(name="wandb"))
    assert project(cfg) == "rlspeed" and wandb_dir(cfg, Path("run")) == Path("run")
    monkeypatch.setenv("WANDB_PROJECT", "a:b")
    monkeypatch.setenv("WANDB_DIR", "/tmp/w")
    assert project(cfg) == "a:b" and wandb_dir(cfg, Path("run")) == Path("/tmp/w")
    with pytest.raises(ConfigError, match="invalid WANDB_PROJECT=a:b: expected a W&B project"):
        check(cfg)
    monkeypatch.delenv("WANDB_PROJECT")
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ConfigError, match="invalid WANDB_MODE=sometimes: expected one of online"):
        check(cfg)
