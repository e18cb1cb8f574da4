"""``num_seeds=N``: N independent agents in one run, per-seed metrics and their mean ± std."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax.serialization import msgpack_restore
from mlflow.tracking import MlflowClient

from rlspeed.core.tasks import cartpole
from rlspeed.registry import ENGINES, TASKS
from rlspeed.seeding import Stream, env_seeds, eval_seeds, int_seed
from tests.conftest import SMALL, run_cli, run_in

SEEDED = [*SMALL, "task.grid_size=7", "total_steps=3000", "num_envs=8"]


def _metrics(out_dir: Path) -> dict:
    return json.loads((out_dir / "metrics.json").read_text())


@pytest.mark.slow
def test_fused_seeds_train_as_one_program_logged_per_seed_and_as_mean(
    make_cfg, tmp_path, monkeypatch
):
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
    # Agent 1 is the run of seed 2 alone: the same keys, so the same episodes and scores.
    # Its weights agree to float rounding only (~1e-7): XLA fuses the vmapped update with
    # other loop orders. Over long runs such a difference can flip a near-tied greedy action,
    # and from there the two runs drift apart as any two runs of different floats would.
    single_cfg = make_cfg([*SEEDED, "seed=2", "backend=flax", "env=jax-vmap", "tracking=none"])
    run_in(tmp_path / "single", monkeypatch, single_cfg)
    single = _metrics(tmp_path / "single")
    for key in ("score", "rolling_step_reward", "recent_return", "env_steps"):
        assert seeds[1][key] == pytest.approx(single[key], rel=1e-6), key
    stacked, alone = (
        jax.tree.leaves(msgpack_restore((path / "checkpoint.msgpack").read_bytes()))
        for path in (out_dir, tmp_path / "single")
    )
    for agents, weights in zip(stacked, alone, strict=True):
        np.testing.assert_allclose(agents[1], weights, rtol=1e-4, atol=1e-5)

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
    run_in(tmp_path / "two", monkeypatch, make_cfg([*base, "seed=5", "num_seeds=2"]))
    run_in(tmp_path / "single", monkeypatch, make_cfg([*base, "seed=6"]))
    two, single = _metrics(tmp_path / "two"), _metrics(tmp_path / "single")
    # The second agent (seed 5 + 1) is exactly the single run with seed 6.
    second = two["seeds"][1]
    for key in ("score", "rolling_step_reward", "env_steps"):
        assert second[key] == single[key], key
    assert two["seeds"][0]["rolling_step_reward"] != second["rolling_step_reward"]
    names = sorted(p.name for p in (tmp_path / "two").glob("checkpoint*"))
    assert names == ["checkpoint_seed0.pt", "checkpoint_seed1.pt"]


def test_streams_of_a_run_and_of_nearby_seeds_never_coincide():
    """One SeedSequence per seed, spawned per purpose: env i of seed 1 is not env i - 1 of
    seed 2 (as seed + i made it), nor any other stream of either."""
    seeds = [
        int_seed(seed, stream, index)
        for seed in range(10)
        for stream, indices in ((Stream.ENV, range(64)), (Stream.EVAL, range(64)))
        for index in indices
    ] + [int_seed(seed, stream) for seed in range(10) for stream in Stream]
    assert len(set(seeds)) == len(seeds)
    assert env_seeds(1, 4) == env_seeds(1, 8)[:4]  # env i's stream whatever num_envs


@pytest.mark.parametrize("engine_name", ["gym-sync", "jax-vmap"])
def test_adjacent_seeds_start_every_env_differently(engine_name, make_cfg):
    """CartPole's start states are continuous: equal ones would mean a shared stream."""
    cfg = make_cfg(["task=cartpole", f"env={engine_name}"])
    starts = []
    for seed in (1, 2):
        engine = ENGINES.get(engine_name).make(TASKS.get("cartpole"), cfg.task, cfg.env, 8, seed)
        starts += [tuple(obs) for obs in np.asarray(engine.reset())]
        engine.close()
    assert len(set(starts)) == 16


def test_evaluation_episodes_are_held_out_from_training_envs():
    seen = []

    def first_batch(obs: np.ndarray) -> np.ndarray:
        if not seen:
            seen.append(obs.copy())
        return np.zeros(len(obs), dtype=np.int64)

    cfg = cartpole.CartPoleTaskConfig(eval_episodes=6)
    cartpole.evaluate(cfg, first_batch, 1)
    env = cartpole.make_env(cfg)
    # The episodes start where the run's evaluation seeds say ...
    expected = [env.reset(seed=s)[0] for s in eval_seeds(1, 6)]
    np.testing.assert_array_equal(seen[0], np.stack(expected))
    # ... and no training env of this seed or the next ones starts there.
    training = {s for seed in range(4) for s in env_seeds(seed, 64)}
    assert not training & {s for seed in range(4) for s in eval_seeds(seed, 64)}
    starts = {tuple(env.reset(seed=s)[0]) for s in env_seeds(1, 64) + env_seeds(2, 64)}
    assert not starts & {tuple(obs) for obs in seen[0]}
