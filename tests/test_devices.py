"""A fused run's lanes over several devices (``backend.devices``): the same numbers per lane
as on one device, files that resume on any device count, and the devices named wherever the
run is recorded. JAX takes its device count as it starts, so the runs on forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``) are CLI processes of their own."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlspeed.errors import ConfigError
from rlspeed.validation import check
from tests.conftest import (
    assert_one_line_error,
    run_cli,
    run_in,
    saved_agent,
    start_cli,
    without_rates,
)

FUSED = ["backend=flax", "env=jax-vmap", "tracking=none", "progress=plain"]
# Four seeds of PPO, logged after each of its first batches: lanes on other devices part
# from their one-device twins by float rounding only (vmap over fewer lanes orders some
# sums otherwise), which PPO's sampled actions amplify within a few thousand steps.
PPO = [*FUSED, "algo=ppo", "task=cartpole", "num_seeds=4", "total_steps=4096"]
PPO += ["log_every=1024", "eval_every=2048"]
# Tabular Q-learning's lanes compute the same numbers whatever the device count, exactly:
# five seeds on four devices are two lanes on each of three (one padded lane). Long enough
# to be cut after its first progress line.
QLEARN = [*FUSED, "algo=qlearn", "task=gridworld", "num_envs=2", "num_seeds=5"]
QLEARN += ["total_steps=600000", "log_every=20000", "eval_every=20000"]


def _on(devices: int) -> dict[str, str]:
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def _rows(metrics: dict) -> list[list[dict[str, float]]]:
    """Each seed's logged rows, rates aside."""
    return [[without_rates(row) for row in seed["history"]] for seed in metrics["seeds"]]


@pytest.mark.parametrize(
    ("setting", "stack", "allowed"),
    [
        ("0", FUSED, "all, or a count in [1, 1,024]"),
        ("two", FUSED, "all, or a count in [1, 1,024]"),
        ("2", ["backend=torch", "env=gym-sync"], "all or 1: devices spread the lanes of a fused"),
        # As many as this process's JAX sees (one CPU device, where no XLA_FLAGS force more).
        ("1024", FUSED, "all, or a count in [1, "),
    ],
)
def test_a_device_count_that_cannot_work_is_one_line(make_cfg, setting, stack, allowed):
    cfg = make_cfg([*stack, "algo=qlearn", "task=gridworld", f"backend.devices={setting}"])
    with pytest.raises(ConfigError) as refused:
        check(cfg)
    line = str(refused.value)
    assert line.startswith(f"rlspeed: invalid backend.devices={setting}: expected {allowed}")


def test_a_host_driven_run_names_its_device(tmp_path, monkeypatch, make_cfg):
    args = ["backend=torch", "env=gym-sync", "algo=qlearn", "task=gridworld", "num_envs=2"]
    args += ["total_steps=200", "log_every=100", "tracking=none", "progress=none"]
    assert run_in(tmp_path / "run", monkeypatch, make_cfg(args))["devices"] == ["cpu"]


@pytest.mark.slow
def test_more_devices_than_there_are_is_refused_before_anything_is_created(tmp_path):
    result = run_cli([*QLEARN, "backend.devices=3"], tmp_path, env=_on(2))
    assert_one_line_error(
        result,
        "rlspeed: invalid backend.devices=3: expected all, or a count in [1, 2] (the devices "
        "this run sees: cpu:0, cpu:1)",
    )
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def one_device_ppo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("one-device")
    result = run_cli([*PPO, "hydra.run.dir=run"], folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return _metrics(folder / "run")


@pytest.mark.slow
@pytest.mark.parametrize("devices", [2, 4])
def test_each_lane_on_several_devices_equals_its_one_device_run(tmp_path, devices, one_device_ppo):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*PPO, "tracking=mlflow", f"tracking.uri={uri}", "hydra.run.dir=run"]
    result = run_cli(args, tmp_path, env=_on(devices))
    assert result.returncode == 0, result.stderr[-3000:]
    names = [f"cpu:{i}" for i in range(devices)]
    assert f"devices                  │ {', '.join(names)}" in result.stdout
    spread = _metrics(tmp_path / "run")
    assert spread["devices"] == names and one_device_ppo["devices"] == ["cpu:0"]
    # Every seed's first logged row, to float rounding.
    for one, several in zip(_rows(one_device_ppo), _rows(spread), strict=True):
        assert one[0].keys() == several[0].keys()
        for key, value in one[0].items():
            assert several[0][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("rlspeed").experiment_id])
    assert run.data.tags["rlspeed.devices"] == ", ".join(names)


def _cut_after_first_log(args: list[str], cwd: Path) -> None:
    """Run the CLI until its first progress line, then SIGTERM it (it saves and ends KILLED)."""
    with start_cli(args, cwd, stderr=subprocess.STDOUT) as proc:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if " - step " in line:
                proc.send_signal(signal.SIGTERM)
                break
        lines += proc.stdout.readlines()
        proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines)[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(("cut_on", "resumed_on"), [(4, 1), (1, 4)])
def test_a_run_cut_on_some_devices_resumes_on_others_to_the_same_end(
    tmp_path, monkeypatch, cut_on, resumed_on
):
    whole = run_cli([*QLEARN, "hydra.run.dir=whole"], tmp_path, env=_on(2))
    assert whole.returncode == 0, whole.stderr[-3000:]
    monkeypatch.setenv("XLA_FLAGS", _on(cut_on)["XLA_FLAGS"])
    _cut_after_first_log([*QLEARN, "hydra.run.dir=cut"], tmp_path)
    cut = _metrics(tmp_path / "cut")
    assert cut["status"] == "KILLED" and 0 < cut["env_steps"] < 5 * 600000
    assert len(cut["devices"]) == (3 if cut_on == 4 else 1)
    resumed = run_cli([*QLEARN, "resume=cut", "hydra.run.dir=resumed"], tmp_path, _on(resumed_on))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = _metrics(tmp_path / "whole"), _metrics(tmp_path / "resumed")
    assert b["status"] == "FINISHED" and len(b["devices"]) == (3 if resumed_on == 4 else 1)
    for key in ("score", "recent_return", "env_steps", "gradient_updates"):
        assert a[key] == b[key], key
    assert _rows(a) == _rows(b)
    assert saved_agent(tmp_path / "whole") == saved_agent(tmp_path / "resumed")


@pytest.mark.slow
def test_a_batched_sweep_over_two_devices_records_every_trial(tmp_path):
    """Three trials as lanes of one program on two devices (two lanes each, one padded):
    each trial finishes with its own folder, metrics.json and MLflow run, naming both."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = [
        "-m", "hparams=qlearn_search", "backend=flax", "env=jax-vmap", "progress=none",
        "total_steps=32000", "hydra.sweeper.report_every=16000", "hydra.sweeper.sampler.seed=1",
        "hydra.sweeper.n_trials=3", "hydra.sweeper.batch_size=3", "hydra/sweeper/pruner=none",
        "tracking=mlflow", f"tracking.uri={uri}",
    ]  # fmt: skip
    result = run_cli(sweep, tmp_path, env=_on(2))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "one program of 3 lane(s)" in result.stdout + result.stderr
    trials = [_metrics(f.parent) for f in tmp_path.glob("outputs/multirun/*/*/*/metrics.json")]
    assert len(trials) == 3
    assert all(t["status"] == "FINISHED" and t["devices"] == ["cpu:0", "cpu:1"] for t in trials)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("rlspeed").experiment_id])
    tagged = {r.info.run_id for r in runs if r.data.tags.get("rlspeed.devices") == "cpu:0, cpu:1"}
    assert tagged == {t["mlflow_run_id"] for t in trials}
