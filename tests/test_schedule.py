"""Step arithmetic of the schedules (rlspeed/core/algos/schedule.py, DQN's learning rate) and the
soft target update when one iteration crosses several sync points."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlspeed.core.algos.dqn import DQNConfig, learning_rate_at, total_updates
from rlspeed.core.algos.dqn.flax import FlaxLearner, make_train
from rlspeed.core.algos.dqn.torch import TorchLearner
from rlspeed.core.algos.replay import Batch
from rlspeed.core.algos.schedule import (
    epsilon_at,
    linear_schedule,
    multiples_between,
    polyak_weight,
    steps_run,
)
from rlspeed.core.envs.gridworld import GridWorldEnv
from rlspeed.core.envs.vmap import make_vmap_env
from rlspeed.registry import TASKS
from rlspeed.run import run
from rlspeed.seeding import jax_keys
from tests.conftest import learner_cfg


def _loop_updates(total_steps: int, num_envs: int, every: int, start: int) -> int:
    """Updates the training loops do: whole iterations of num_envs steps until total_steps."""
    step = updates = 0
    while step < total_steps:
        prev, step = step, step + num_envs
        updates += int(multiples_between(prev, step, every, start))
    return updates


@pytest.mark.parametrize(
    ("prev", "step", "every", "start", "expected"),
    [
        (0, 8, 4, 0, 2),  # 4, 8
        (3, 9, 4, 0, 2),  # 4, 8: the interval is (prev, step]
        (4, 8, 4, 0, 1),  # 8 (4 was counted by the previous interval)
        (0, 20, 4, 10, 3),  # 12, 16, 20: none before start
        (0, 10, 4, 10, 0),
        (5, 6, 4, 0, 0),
        (0, 7, 1, 0, 7),
    ],
)
def test_multiples_between_counts_the_multiples_crossed(prev, step, every, start, expected):
    assert multiples_between(prev, step, every, start) == expected
    assert int(multiples_between(jnp.int32(prev), jnp.int32(step), every, start, jnp)) == expected


@pytest.mark.parametrize("num_envs", [1, 3, 7, 64])
@pytest.mark.parametrize("total_steps", [1000, 1003, 1009])
def test_one_update_every_k_env_steps_whatever_num_envs(num_envs, total_steps):
    steps = steps_run(total_steps, num_envs)
    assert steps % num_envs == 0 and total_steps <= steps < total_steps + num_envs
    loop = _loop_updates(total_steps, num_envs, every=4, start=100)
    assert loop == steps // 4 - 100 // 4 == multiples_between(0, steps, 4, 100)


def test_linear_schedule_and_epsilon():
    assert linear_schedule(0, 1.0, 0.1, 100) == 1.0
    assert linear_schedule(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert linear_schedule(100, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert linear_schedule(10_000, 1.0, 0.1, 100) == pytest.approx(0.1)
    # A zero duration is reached at once, never divided by.
    assert linear_schedule(1, 1.0, 0.1, 0.0) == pytest.approx(0.1)
    algo = DQNConfig(start_e=1.0, end_e=0.05, exploration_fraction=0.5)
    assert epsilon_at(0, algo, 1000) == 1.0
    assert epsilon_at(250, algo, 1000) == pytest.approx(0.525)
    assert epsilon_at(500, algo, 1000) == epsilon_at(999, algo, 1000) == pytest.approx(0.05)
    assert float(epsilon_at(jnp.int32(250), algo, 1000, jnp)) == pytest.approx(0.525)


@pytest.mark.parametrize(
    ("total_steps", "num_envs", "train_frequency", "learning_starts"),
    [(1003, 7, 1, 0), (1003, 7, 4, 100), (999, 64, 2, 10), (50_001, 384, 4, 5000), (10, 3, 1, 0)],
)
def test_annealed_learning_rate_stays_positive_to_the_last_update(
    total_steps, num_envs, train_frequency, learning_starts
):
    algo = DQNConfig(
        anneal_lr=True,
        learning_rate=0.01,
        train_frequency=train_frequency,
        learning_starts=learning_starts,
    )
    count = total_updates(algo, total_steps, num_envs)
    # The count is what the loop does (it runs past total_steps to a multiple of num_envs).
    assert count == _loop_updates(total_steps, num_envs, train_frequency, learning_starts)
    rates = np.array([learning_rate_at(u, algo, total_steps, num_envs) for u in range(count)])
    assert rates[0] == 0.01
    assert rates[-1] == pytest.approx(0.01 / count) and (rates > 0).all()
    assert (np.diff(rates) < 0).all()
    # The jitted optimizer's schedule (float32 JAX scalars: 1 - u / count cancels, so the
    # last rate is within float32 rounding of count ~ 1e4 times its size) stays positive.
    jax_last = float(learning_rate_at(jnp.int32(count - 1), algo, total_steps, num_envs))
    assert jax_last > 0 and jax_last == pytest.approx(rates[-1], rel=1e-2)
    assert learning_rate_at(5, DQNConfig(learning_rate=0.01), total_steps, num_envs) == 0.01


def test_annealed_run_does_the_counted_updates_and_ends_above_zero(make_cfg, tmp_path, monkeypatch):
    """A real run with total_steps not a multiple of num_envs (the rate went negative)."""
    overrides = [
        "backend=torch", "env=gym-sync", "task=gridworld", "num_envs=7", "total_steps=403",
        "algo.anneal_lr=true", "algo.learning_rate=0.01", "algo.train_frequency=1",
        "algo.learning_starts=20", "algo.batch_size=8", "algo.buffer_size=500",
        "algo.hidden_sizes=[8]", "log_every=200", "eval_every=403", "tracking=none",
        "progress=none",
    ]  # fmt: skip
    cfg = make_cfg(overrides)
    monkeypatch.chdir(tmp_path)
    run(cfg)
    count = total_updates(cfg.algo, 403, 7)
    assert count == 406 - 20
    assert json.loads((tmp_path / "metrics.json").read_text())["gradient_updates"] == count
    lr = torch.load(tmp_path / "checkpoint.pt")["optimizer"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(0.01 / count)


def test_polyak_weight_of_k_crossings_is_k_steps_in_one():
    assert polyak_weight(1.0, 1) == polyak_weight(1.0, 5) == 1.0  # a copy stays a copy
    assert polyak_weight(0.3, 1) == pytest.approx(0.3)
    target, online = 5.0, 1.0
    for _ in range(4):
        target += 0.3 * (online - target)
    assert 5.0 + polyak_weight(0.3, 4) * (online - 5.0) == pytest.approx(target)
    assert float(polyak_weight(0.3, jnp.int32(4))) == pytest.approx(polyak_weight(0.3, 4))


def _gridworld_batch(size: int = 16) -> Batch:
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 25, size).astype(np.int64)
    return Batch(
        obs,
        rng.integers(0, 25, size).astype(np.int64),
        rng.integers(0, 4, size).astype(np.int64),
        rng.normal(size=size).astype(np.float32),
        np.zeros(size, np.float32),
    )


def _torch_params(network) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in network.parameters()]


def _flax_params(params) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def _assert_moved_by(before, online, after, weight):
    for b, o, a in zip(before, online, after, strict=True):
        np.testing.assert_allclose(a, b + weight * (o - b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tau", [0.3, 1.0])
@pytest.mark.parametrize("backend", ["torch", "flax"])
def test_host_learner_syncs_every_crossed_target_point(backend, tau):
    """One iteration of 7 env steps with a sync every 2 crosses 3 sync points (2, 4, 6)."""
    algo = OmegaConf.structured(
        DQNConfig(
            hidden_sizes=[8], tau=tau, target_network_frequency=2, learning_starts=0,
            learning_rate=0.05,
        )
    )  # fmt: skip
    env = GridWorldEnv()
    learner = {"torch": TorchLearner, "flax": FlaxLearner}[backend](
        env.observation_space, env.action_space, learner_cfg(algo, total_steps=100, num_envs=7), 0
    )
    learner.update(_gridworld_batch())
    if backend == "torch":
        params = lambda: _torch_params(learner.q_network)  # noqa: E731
        target = lambda: _torch_params(learner.target_network)  # noqa: E731
    else:
        params = lambda: _flax_params(learner.agent.params)  # noqa: E731
        target = lambda: _flax_params(learner.agent.target_params)  # noqa: E731
    before, online = target(), params()
    assert any(not np.array_equal(b, o) for b, o in zip(before, online, strict=True))
    learner.after_env_steps(0, 7)
    _assert_moved_by(before, online, target(), 1 - (1 - tau) ** 3)
    if tau == 1.0:
        assert all(np.array_equal(t, o) for t, o in zip(target(), online, strict=True))


def test_fused_iteration_syncs_every_crossed_target_point(make_cfg):
    """flax + jax-vmap: 8 envs, one update, then 4 sync points crossed at tau 0.5."""
    cfg = OmegaConf.to_object(
        make_cfg(
            [
                "task=gridworld", "num_envs=8", "total_steps=64", "algo.hidden_sizes=[8]",
                "algo.learning_starts=0", "algo.train_frequency=8", "algo.batch_size=4",
                "algo.buffer_size=64", "algo.target_network_frequency=2", "algo.tau=0.5",
            ]
        )
    )  # fmt: skip
    trainer = make_train(cfg, make_vmap_env(TASKS.get("gridworld"), cfg.task, cfg.num_envs))
    state = jax.jit(trainer.init)(jax_keys(0))  # one compilation: eager init takes longer
    after, _ = jax.jit(trainer.run, static_argnums=1)(state, 1, 1)
    assert int(after.updates) == 1
    before, online = _flax_params(state.agent.target_params), _flax_params(after.agent.params)
    _assert_moved_by(before, online, _flax_params(after.agent.target_params), 1 - 0.5**4)
