"""``num_seeds=N``: N independent agents in one run, per-seed metrics and their mean ± std."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient

from rlspeed.run import run
from tests.conftest import SMALL, run_cli

SEEDED = [*SMALL, "task.grid_size=7", "total_steps=3000", "num_envs=8"]


def _metrics(out_dir: Path) -> dict:
    return json.loads((out_dir / "metrics.json").read_text())


def _run_in(directory: Path, monkeypatch, cfg) -> float:
    directory.mkdir()
    monkeypatch.chdir(directory)
    return run(cfg)


def test_fused_seeds_train_as_one_program_logged_per_seed_and_as_mean(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*SEEDED, "num_seeds=3", f"tracking.uri={uri}", "backend=flax", "env=jax-vmap"]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out_dir = next((tmp_path / "outputs").glob("*/*"))
    metrics = _metrics(out_dir)
    seeds = metrics["seeds"]
    assert metrics["num_seeds"] == 3 and len(seeds) == 3
    # Three different agents, and the run's numbers are their mean (steps: their sum).
    assert len({s["rolling_step_reward"] for s in seeds}) == 3
    assert metrics["score"] == np.mean([s["score"] for s in seeds])
    assert metrics["env_steps"] == sum(s["env_steps"] for s in seeds) == 3 * 3000
    # One checkpoint holds the three agents, stacked along the first axis.
    assert [p.name for p in out_dir.glob("checkpoint*")] == ["checkpoint.msgpack"]

    client = MlflowClient(tracking_uri=uri)
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("rlspeed").experiment_id])
    logged = mlflow_run.data.metrics
    for name in ("eval/score", "charts/episodic_return", "losses/td_loss"):
        per_seed = [logged[f"seed{i}/{name}"] for i in range(3)]
        assert logged[name] == np.mean(per_seed)
        assert logged[f"{name}_std"] == np.std(per_seed)
    assert logged["eval/score"] == metrics["score"]


def test_host_seeds_run_one_after_another_each_like_a_single_run(make_cfg, tmp_path, monkeypatch):
    base = [*SEEDED, "backend=torch", "env=gym-sync", "tracking=none", "progress=none"]
    _run_in(tmp_path / "two", monkeypatch, make_cfg([*base, "seed=5", "num_seeds=2"]))
    _run_in(tmp_path / "single", monkeypatch, make_cfg([*base, "seed=6"]))
    two, single = _metrics(tmp_path / "two"), _metrics(tmp_path / "single")
    # The second agent (seed 5 + 1) is exactly the single run with seed 6.
    second = two["seeds"][1]
    for key in ("score", "rolling_step_reward", "env_steps"):
        assert second[key] == single[key], key
    assert two["seeds"][0]["rolling_step_reward"] != second["rolling_step_reward"]
    names = sorted(p.name for p in (tmp_path / "two").glob("checkpoint*"))
    assert names == ["checkpoint_seed0.pt", "checkpoint_seed1.pt"]


def test_num_seeds_below_one_is_one_clear_line(tmp_path):
    from tests.conftest import assert_one_line_error

    result = run_cli([*SEEDED, "num_seeds=0"], cwd=tmp_path)
    assert_one_line_error(result, "num_seeds", "0", ">= 1")
    assert not (tmp_path / "outputs").exists()
