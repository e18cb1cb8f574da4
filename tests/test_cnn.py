"""Image observations: ``algo.network=auto`` puts the conv torso in front of the MLP for
images only, ``cnn`` elsewhere is one line, and the torch and flax twins start alike and
agree update for update (DQN, PQN, PPO, VPG) on MinAtar-shaped frames. No gymnax here:
the frames are drawn (the MinAtar runs are in tests/test_minatar.py)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from gymnasium import spaces
from omegaconf import OmegaConf

from rlspeed.core.algos import dqn, ppo, pqn, vpg
from rlspeed.core.algos.dqn.flax import FlaxLearner as DQNFlax
from rlspeed.core.algos.dqn.torch import TorchLearner as DQNTorch
from rlspeed.core.algos.encoding import through_torso
from rlspeed.core.algos.networks import HIDDEN_GAIN, torso_size
from rlspeed.core.algos.networks.flax import MLP as FlaxMLP
from rlspeed.core.algos.networks.flax import UnpaddedConv
from rlspeed.core.algos.networks.torch import MLP as TorchMLP
from rlspeed.core.algos.ppo.flax import FlaxLearner as PPOFlax
from rlspeed.core.algos.ppo.flax import functions as ppo_functions
from rlspeed.core.algos.ppo.torch import TorchLearner as PPOTorch
from rlspeed.core.algos.pqn.flax import FlaxLearner as PQNFlax
from rlspeed.core.algos.pqn.flax import functions as pqn_functions
from rlspeed.core.algos.pqn.torch import TorchLearner as PQNTorch
from rlspeed.core.algos.replay import Batch
from rlspeed.core.algos.rollout import RolloutBatch
from rlspeed.core.algos.vpg.flax import FlaxLearner as VPGFlax
from rlspeed.core.algos.vpg.torch import TorchLearner as VPGTorch
from rlspeed.errors import ConfigError
from rlspeed.validation import check
from tests.conftest import learner_cfg

# Breakout-MinAtar's frames: 10 x 10 cells, 4 channels of 0/1.
FRAMES = spaces.Box(0.0, 1.0, (10, 10, 4), np.float32)
ACTIONS = spaces.Discrete(3)
BATCH = 64

# ---------------------------------------------------------------- which network


@pytest.mark.parametrize(
    ("space", "network", "torso"),
    [
        (FRAMES, "auto", True),
        (FRAMES, "mlp", False),
        (FRAMES, "cnn", True),
        (spaces.Box(-1.0, 1.0, (4,), np.float32), "auto", False),
        # Too small for the 3 x 3 kernel, or categorical: the MLP.
        (spaces.Box(0.0, 1.0, (2, 8, 3), np.float32), "auto", False),
        (spaces.MultiDiscrete(np.full((5, 5, 2), 3)), "auto", False),
    ],
)
def test_auto_takes_the_torso_for_images_only(space, network, torso):
    assert through_torso(space, network) is torso


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algo=ppo", "task=cartpole", "algo.network=cnn"],
            "algo.network=cnn: expected auto or mlp: cnn takes image observations (a Box of "
            "height x width x channels, at least 3 x 3), and task=cartpole's are no images",
        ),
        (["algo=dqn", "algo.network=conv"], "algo.network=conv: expected one of auto, mlp, cnn"),
    ],
    ids=["cnn-without-images", "unknown"],
)
def test_a_network_that_cannot_be_is_one_line(make_cfg, overrides, message):
    with pytest.raises(ConfigError) as raised:
        check(make_cfg(["tracking=none", *overrides]))
    assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


# ---------------------------------------------------------------- torch == flax


def _flax_weights(params: dict) -> list[np.ndarray]:
    """An MLP's weights (a policy's inside its MLP_0) as torch lays them out and orders
    them: each conv kernel as [out, in, height, width] and its bias, then each Dense
    kernel transposed and its bias, with its LayerNorm's scale and bias after it."""
    params = params["params"]
    params = params.get("MLP_0", params)
    weights = []
    for i in range(sum(name.startswith("Conv_") for name in params)):
        conv = params[f"Conv_{i}"]
        weights += [np.asarray(conv["kernel"]).transpose(3, 2, 0, 1), np.asarray(conv["bias"])]
    for i in range(sum(name.startswith("Dense_") for name in params)):
        dense = params[f"Dense_{i}"]
        weights += [np.asarray(dense["kernel"]).T, np.asarray(dense["bias"])]
        if (norm := params.get(f"LayerNorm_{i}")) is not None:
            weights += [np.asarray(norm["scale"]), np.asarray(norm["bias"])]
    return weights


def _torch_weights(module: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy() for p in module.parameters()]


def _copy(flax_params: dict, module: torch.nn.Module) -> None:
    """The flax network's weights into its torch twin."""
    with torch.no_grad():
        for param, weight in zip(module.parameters(), _flax_weights(flax_params), strict=True):
            param.copy_(torch.from_numpy(weight.copy()))


def _assert_same_weights(flax_params: dict, module: torch.nn.Module) -> None:
    for a, b in zip(_flax_weights(flax_params), _torch_weights(module), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)


def _assert_same_metrics(flax_metrics: dict, torch_metrics: dict) -> None:
    assert flax_metrics.keys() == torch_metrics.keys()
    for name, value in flax_metrics.items():
        np.testing.assert_allclose(
            float(value), float(torch_metrics[name]), rtol=1e-4, atol=1e-5, err_msg=name
        )


def _frames(rng: np.random.Generator, size: int) -> np.ndarray:
    """Frames of 0/1 cells, a third of them 1: denser than MinAtar's, so no 3 x 3 patch is
    all 0. An all-0 patch puts a unit on ReLU's kink (its bias, 0 at first, then tiny): a
    rounding apart there, the backends' gradients part, and Adam scales the tiny ones up."""
    return (rng.random((size, *FRAMES.shape)) < 1 / 3).astype(np.float32)


@pytest.mark.parametrize("orthogonal", [False, True], ids=["lecun", "orthogonal"])
def test_the_twins_have_the_same_layers_and_start_alike(orthogonal):
    """The same layers and shapes (conv, then the MLP's Dense layers), drawn alike: LeCun
    normal (truncated at 2 std) or orthogonal with the hidden gain, biases 0. From the same
    weights, the same outputs."""
    gain = 1.0 if orthogonal else None
    flax_mlp = FlaxMLP(ACTIONS.n, (64,), 0, output_gain=gain, torso=True)
    flax_params = flax_mlp.init(jax.random.key(0), jnp.zeros((1, *FRAMES.shape)))
    torch.manual_seed(0)
    torch_mlp = TorchMLP(FRAMES, ACTIONS.n, [64], output_gain=gain, torso=True)
    flax_w, torch_w = _flax_weights(flax_params), _torch_weights(torch_mlp)
    features = torso_size(FRAMES.shape).features
    assert features == 8 * 8 * 16
    shapes = [(16, 4, 3, 3), (16,), (64, features), (64,), (3, 64), (3,)]
    assert [w.shape for w in flax_w] == [w.shape for w in torch_w] == shapes
    for a, b in zip(flax_w, torch_w, strict=True):
        if a.ndim == 1:
            assert not a.any() and not b.any()
            continue
        for w in (a.reshape(len(a), -1), b.reshape(len(b), -1)):  # [out, fan-in]
            fan_in = w.shape[1]
            if orthogonal:  # orthonormal rows, scaled by the gain (the output's 1 aside)
                scale = HIDDEN_GAIN if w.shape[0] > 3 else 1.0
                np.testing.assert_allclose(w @ w.T, scale**2 * np.eye(len(w)), atol=1e-5)
            else:
                std = np.sqrt(1 / fan_in)
                assert abs(w.std() / std - 1) < 0.1
                assert np.abs(w).max() <= 2 * std / 0.8796 + 1e-6

    _copy(flax_params, torch_mlp)
    obs = _frames(np.random.default_rng(0), 16)
    np.testing.assert_allclose(
        np.asarray(flax_mlp.apply(flax_params, obs)),
        torch_mlp(torch.from_numpy(obs)).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_the_torso_is_flaxs_unpadded_convolution():
    """The patches' matrix product computes nn.Conv's outputs from its parameters."""
    x = jnp.asarray(_frames(np.random.default_rng(0), 8))
    conv = nn.Conv(16, (3, 3), padding="VALID")
    params = conv.init(jax.random.key(0), x)
    patched = UnpaddedConv(16, nn.linear.default_kernel_init)
    assert jax.tree.map(jnp.shape, patched.init(jax.random.key(0), x)) == jax.tree.map(
        jnp.shape, params
    )
    np.testing.assert_allclose(patched.apply(params, x), conv.apply(params, x), atol=1e-5)


def test_dqn_twins_update_alike():
    cfg = learner_cfg(
        OmegaConf.structured(dqn.DQNConfig(hidden_sizes=[32], learning_rate=1e-3)),
        total_steps=1000,
    )
    flax_learner = DQNFlax(FRAMES, ACTIONS, cfg, seed=0)
    torch_learner = DQNTorch(FRAMES, ACTIONS, cfg, seed=0)
    _copy(flax_learner.agent.params, torch_learner.q_network)
    _copy(flax_learner.agent.target_params, torch_learner.target_network)
    rng = np.random.default_rng(0)
    batch = Batch(
        _frames(rng, BATCH),
        _frames(rng, BATCH),
        rng.integers(0, ACTIONS.n, BATCH),
        rng.normal(size=BATCH).astype(np.float32),
        (rng.random(BATCH) < 0.2).astype(np.float32),
    )
    np.testing.assert_array_equal(flax_learner.greedy(batch.obs), torch_learner.greedy(batch.obs))
    for _ in range(3):  # the optimizer states carried
        _assert_same_metrics(flax_learner.update(batch), torch_learner.update(batch))
    _assert_same_weights(flax_learner.agent.params, torch_learner.q_network)


def _rollout_batch(rng: np.random.Generator) -> RolloutBatch:
    advantages = rng.normal(0.5, 2.0, BATCH).astype(np.float32)
    returns = rng.normal(1.0, 2.0, BATCH).astype(np.float32)
    return RolloutBatch(
        _frames(rng, BATCH),
        rng.integers(0, ACTIONS.n, BATCH),
        rng.normal(-1.1, 0.1, BATCH).astype(np.float32),  # near the first policy's log(1/3)
        returns - advantages,
        advantages,
        returns,
    )


# Slow (6 s each on 2 cores): PQN's and VPG's updates are checked twin against twin without
# the torso in their own files; the torso inside an update is DQN's and PPO's tests here.
@pytest.mark.slow
def test_pqn_twins_update_alike():
    algo = pqn.PQNConfig(hidden_sizes=[32], learning_rate=3e-3, update_epochs=2)
    cfg = learner_cfg(OmegaConf.structured(algo), total_steps=256, num_envs=2)
    flax_learner = PQNFlax(FRAMES, ACTIONS, cfg, seed=0)
    torch_learner = PQNTorch(FRAMES, ACTIONS, cfg, seed=0)
    _copy(flax_learner.agent.policy_params.q_params, torch_learner.q_network)
    update = jax.jit(pqn_functions(cfg, FRAMES, ACTIONS).update)
    rng = np.random.default_rng(0)
    batch = _rollout_batch(rng)
    for _ in range(3):  # the step size annealed, the optimizer state carried
        orders = np.stack([rng.permutation(BATCH) for _ in range(algo.update_epochs)])
        flax_learner.agent, flax_metrics = update(
            flax_learner.agent, batch, jax.random.key(0), jnp.asarray(orders)
        )
        _assert_same_metrics(flax_metrics, torch_learner.update(batch, orders))
    _assert_same_weights(flax_learner.agent.policy_params.q_params, torch_learner.q_network)


def test_ppo_twins_update_alike():
    # Orthogonal init: the twins' other way to start (checked above).
    algo = ppo.PPOConfig(
        hidden_sizes=[32], learning_rate=3e-3, update_epochs=2, orthogonal_init=True
    )
    cfg = learner_cfg(OmegaConf.structured(algo), total_steps=256, num_envs=2)
    flax_learner = PPOFlax(FRAMES, ACTIONS, cfg, seed=0)
    torch_learner = PPOTorch(FRAMES, ACTIONS, cfg, seed=0)
    agent = flax_learner.agent
    _copy(agent.policy_params, torch_learner.policy)
    _copy(agent.value_params, torch_learner.value)
    update = jax.jit(ppo_functions(cfg, FRAMES, ACTIONS).update)
    rng = np.random.default_rng(0)
    batch = _rollout_batch(rng)
    np.testing.assert_allclose(
        flax_learner.values(batch.obs), torch_learner.values(batch.obs), rtol=1e-5, atol=1e-6
    )
    for _ in range(3):
        orders = np.stack([rng.permutation(BATCH) for _ in range(algo.update_epochs)])
        flax_learner.agent, flax_metrics = update(
            flax_learner.agent, batch, jax.random.key(0), jnp.asarray(orders)
        )
        _assert_same_metrics(flax_metrics, torch_learner.update(batch, orders))
    _assert_same_weights(flax_learner.agent.policy_params, torch_learner.policy)
    _assert_same_weights(flax_learner.agent.value_params, torch_learner.value)


@pytest.mark.slow
def test_vpg_twins_update_alike():
    algo = vpg.VPGConfig(hidden_sizes=[32], value_iterations=3, ent_coef=0.01)
    cfg = learner_cfg(OmegaConf.structured(algo), total_steps=1000)
    flax_learner = VPGFlax(FRAMES, ACTIONS, cfg, seed=0)
    torch_learner = VPGTorch(FRAMES, ACTIONS, cfg, seed=0)
    _copy(flax_learner.agent.policy_params, torch_learner.policy)
    _copy(flax_learner.agent.value_params, torch_learner.value)
    batch = _rollout_batch(np.random.default_rng(0))
    for _ in range(3):
        _assert_same_metrics(flax_learner.update(batch), torch_learner.update(batch))
    _assert_same_weights(flax_learner.agent.policy_params, torch_learner.policy)
    _assert_same_weights(flax_learner.agent.value_params, torch_learner.value)
