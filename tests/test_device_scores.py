"""The fused path scores agents on the task's JAX twin (``TaskSpec.evaluate_on_device``,
every seed in one program): on the deterministic tasks that score must be the host's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from rlspeed.registry import TASKS


def _hashed_policy(seed: int, actions: int):
    """A fixed arbitrary greedy policy: observation -> one of ``actions``, traceable."""
    table = jax.random.randint(jax.random.key(seed), (4096,), 0, actions)

    def act(obs):
        codes = jnp.asarray(obs).reshape(obs.shape[0], -1).astype(jnp.int32)
        return table[(codes * (jnp.arange(codes.shape[1]) + 1)).sum(-1) % 4096]

    return act


def _to_goal(size: int):
    """GridWorld: left along the bottom row, then up (the goal is the top-left cell)."""
    return lambda cells: jnp.where(jnp.asarray(cells) % size > 0, 2, 3)


def _scores(task_name: str, settings: dict, act) -> tuple[float, float]:
    task = TASKS.get(task_name)
    cfg = OmegaConf.structured(task.schema(**settings))
    host = task.evaluate(cfg, lambda obs: np.asarray(act(jnp.asarray(obs))), 0)
    device = jax.jit(lambda key: task.evaluate_on_device(cfg, act, key))(jax.random.key(0))
    return host, float(device)


@pytest.mark.parametrize("settings", [{}, {"grid_size": 7, "n_doors": 2}])
@pytest.mark.parametrize("seed", range(4))
def test_doors_device_score_is_the_host_score(settings, seed):
    host, device = _scores("doors", settings, _hashed_policy(seed, 5))
    assert host != 0.0
    assert device == pytest.approx(host, rel=1e-5, abs=1e-8)  # float32 against float64


@pytest.mark.parametrize("size", [2, 5, 9])
def test_gridworld_device_score_is_the_host_score(size):
    assert _scores("gridworld", {"size": size}, _to_goal(size)) == (1.0, 1.0)
    assert _scores("gridworld", {"size": size}, lambda cells: jnp.zeros_like(cells)) == (0.0, 0.0)
