"""MLflow records every run: params, metrics, tags, artifacts and the real end status."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import SMALL, free_port, run_cli, start_cli


def _only_run(uri: str):
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rlspeed")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def assert_every_row_in_mlflow(client: MlflowClient, run_id: str, out_dir: Path) -> int:
    """Every row of the run's ``metrics.json`` (each seed's as ``seed<i>/<name>``) is in the
    MLflow run, and MLflow holds no other; returns how many values that is."""
    metrics = json.loads((out_dir / "metrics.json").read_text())
    streams = [("", metrics["history"])]
    streams += [(f"seed{i}/", seed["history"]) for i, seed in enumerate(metrics.get("seeds", []))]
    expected: dict[str, list[tuple[int, float]]] = {}
    for prefix, rows in streams:
        for row in rows:
            for name, value in row.items():
                if name != "step":
                    expected.setdefault(prefix + name, []).append((int(row["step"]), value))
    run = client.get_run(run_id)
    assert set(run.data.metrics) == set(expected)
    for name, values in expected.items():
        recorded = [(m.step, m.value) for m in client.get_metric_history(run_id, name)]
        assert sorted(recorded) == sorted(values), name
    return sum(map(len, expected.values()))


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
