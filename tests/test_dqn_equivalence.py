"""The torch and flax DQN implementations compute the same numbers from the same weights."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlspeed.core.algos.dqn import DQNConfig
from rlspeed.core.algos.dqn.flax import FlaxLearner
from rlspeed.core.algos.dqn.torch import TorchLearner
from rlspeed.core.algos.replay import Batch
from rlspeed.core.envs.doors import DoorsEnv
from tests.conftest import learner_cfg


def _copy_flax_to_torch(flax_params, network: torch.nn.Module) -> None:
    dense = flax_params["params"]
    linears = [m for m in network.net if isinstance(m, torch.nn.Linear)]
    assert len(linears) == len(dense)
    with torch.no_grad():
        for i, linear in enumerate(linears):
            linear.weight.copy_(
                torch.from_numpy(np.asarray(dense[f"Dense_{i}"]["kernel"]).T.copy())
            )
            linear.bias.copy_(torch.from_numpy(np.array(dense[f"Dense_{i}"]["bias"])))


def _torch_layers(network: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy() for p in network.parameters()]


def _flax_layers(params) -> list[np.ndarray]:
    layers = []
    for name in sorted(params["params"]):
        layers += [
            np.asarray(params["params"][name]["kernel"]).T,
            np.asarray(params["params"][name]["bias"]),
        ]
    return layers


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_same_weights_same_update(optimizer):
    algo = OmegaConf.structured(
        DQNConfig(hidden_sizes=[32, 32], optimizer=optimizer, learning_rate=1e-2)
    )
    env = DoorsEnv()
    cfg = learner_cfg(algo, total_steps=1000, num_envs=1)
    flax_learner = FlaxLearner(env.observation_space, env.action_space, cfg, seed=0)
    torch_learner = TorchLearner(env.observation_space, env.action_space, cfg, seed=0)
    _copy_flax_to_torch(flax_learner.agent.params, torch_learner.q_network)
    _copy_flax_to_torch(flax_learner.agent.target_params, torch_learner.target_network)

    rng = np.random.default_rng(0)
    obs = np.stack([env.reset(seed=int(s))[0] for s in rng.integers(0, 1000, 64)])
    next_obs = np.stack([env.step(int(a))[0] for a in rng.integers(0, 5, 64)])
    batch = Batch(
        obs,
        next_obs,
        rng.integers(0, 5, 64).astype(np.int64),
        rng.normal(size=64).astype(np.float32),
        (rng.random(64) < 0.2).astype(np.float32),
    )
    np.testing.assert_array_equal(flax_learner.greedy(obs), torch_learner.greedy(obs))
    for _ in range(3):  # several steps, so the optimizer state is compared too
        flax_metrics = flax_learner.update(batch)
        torch_metrics = torch_learner.update(batch)
        assert flax_metrics.keys() == torch_metrics.keys() == {"losses/td_loss", "losses/q_values"}
        for name, value in flax_metrics.items():
            np.testing.assert_allclose(
                float(value), float(torch_metrics[name]), rtol=1e-4, atol=1e-6
            )
    for flax_w, torch_w in zip(
        _flax_layers(flax_learner.agent.params), _torch_layers(torch_learner.q_network), strict=True
    ):
        np.testing.assert_allclose(flax_w, torch_w, atol=2e-5)


def test_initialisation_follows_the_same_distribution():
    """Both backends start from truncated LeCun-normal weights and zero biases."""
    cfg = learner_cfg(DQNConfig(hidden_sizes=[256]), total_steps=1000, num_envs=1)
    env = DoorsEnv()
    flax_w = _flax_layers(FlaxLearner(env.observation_space, env.action_space, cfg, 0).agent.params)
    torch_w = _torch_layers(TorchLearner(env.observation_space, env.action_space, cfg, 0).q_network)
    for a, b in zip(flax_w, torch_w, strict=True):
        assert a.shape == b.shape
        if a.ndim == 2:
            assert abs(a.std() / b.std() - 1) < 0.05
            assert np.abs(a).max() <= 2 * np.sqrt(1 / a.shape[1]) / 0.8796 + 1e-6
        else:
            assert not a.any() and not b.any()


def test_torch_reads_jax_arrays_without_copy():
    """backend=torch env=jax-vmap: observations cross by DLPack, sharing memory."""
    array = jax.numpy.arange(12, dtype=jax.numpy.int8).reshape(3, 4)
    tensor = torch.from_dlpack(array)
    assert tensor.data_ptr() == array.unsafe_buffer_pointer()
    back = jax.dlpack.from_dlpack(torch.arange(3, dtype=torch.int32))
    assert back.tolist() == [0, 1, 2]
