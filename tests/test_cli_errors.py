"""Bad input: one clear line naming key, value and what is allowed; non-zero exit; no work."""

from __future__ import annotations

import pytest

from tests.conftest import assert_one_line_error, free_port, run_cli


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["backend=jax"], ["backend=jax", "flax, torch"]),
        (["env=gym-fast"], ["env=gym-fast", "gym-async, gym-sync, jax-vmap"]),
        (["algo=a2c"], ["algo=a2c", "dqn, ppo, qlearn, td3, vpg"]),
        (["num_envs=abc"], ["num_envs", "'abc'", "Integer"]),
        (["algo.learning_rate=fast"], ["algo.learning_rate", "'fast'", "Float"]),
        (["num_envs=0"], ["num_envs=0", ">= 1"]),
        (["total_steps=-5"], ["total_steps=-5", ">= 1"]),
        (["algo.optimizer=rmsprop"], ["algo.optimizer=rmsprop", "adam, sgd"]),
        (["no_such_key=1"], ["no_such_key"]),
        (
            ["backend=flax", "backend.compilation_cache=/proc/rlspeed-xla"],
            ["backend.compilation_cache=/proc/rlspeed-xla", "create and write"],
        ),
        (["-m", "backend=torch,jax"], ["backend=jax", "flax, torch"]),
    ],
)
def test_bad_input_gets_one_clear_line(tmp_path, args, fragments):
    result = run_cli([*args, "tracking=none"], cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "outputs").exists(), "no run may start on bad input"


def test_unreachable_tracking_uri(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    result = run_cli([f"tracking.uri={uri}"], cwd=tmp_path)
    assert_one_line_error(result, "tracking.uri", uri, "reachable MLflow server")
    assert not (tmp_path / "outputs").exists()


def test_unreachable_tracking_uri_from_environment(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    result = run_cli([], cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert_one_line_error(result, "MLFLOW_TRACKING_URI", uri)


def test_hydra_own_flags_still_work(tmp_path):
    result = run_cli(["--cfg", "job", "backend=torch", "env=gym-sync"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: torch" in result.stdout and "name: gym-sync" in result.stdout
    assert run_cli(["--help"], cwd=tmp_path).returncode == 0


def test_multirun_grid_with_hydra_basic_sweeper(tmp_path):
    """`rlspeed -m backend=torch,flax ...` runs one job per combination."""
    args = ["-m", "backend=torch,flax", "env=gym-sync", "tracking=none", "progress=plain"]
    budget = ["total_steps=600", "log_every=300", "eval_every=600", "algo.learning_starts=200"]
    result = run_cli([*args, *budget, "num_envs=2", "algo.batch_size=16"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = sorted(p.name for p in (tmp_path / "outputs" / "multirun").glob("*/*/*") if p.is_dir())
    assert jobs == ["0_torch_gym-sync_dqn_doors", "1_flax_gym-sync_dqn_doors"]
    for job in (tmp_path / "outputs" / "multirun").glob("*/*/*_dqn_doors"):
        assert (job / "metrics.json").exists() and (job / "learning_curve.png").exists()
