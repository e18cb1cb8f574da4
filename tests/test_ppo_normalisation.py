"""PPO's observation normalisation, reward scaling and orthogonal init: the statistics are
NumPy's mean and variance of what was seen, reward scaling is Gymnasium's NormalizeReward
by hand, orthogonal weights have the right gains on both backends, the host (NumPy) and
fused (JAX) statistics agree and torch and flax act alike on them, checkpoints keep the
statistics (``mode=eval`` scores as training did) and a resumed run ends bit-exactly like
the whole one."""

from __future__ import annotations

import json
import math

import flax.serialization
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlspeed.checkpoint import read_agent
from rlspeed.core.algos.networks.flax import ActorCritic as FlaxActorCritic
from rlspeed.core.algos.networks.torch import ActorCritic as TorchActorCritic
from rlspeed.core.algos.normalization import (
    EPS,
    HostNormalization,
    NormSettings,
    init_state,
    observe,
    scale_rewards,
)
from rlspeed.core.algos.ppo import PPOConfig
from rlspeed.core.algos.ppo.flax import FlaxLearner
from rlspeed.core.algos.ppo.torch import TorchLearner
from rlspeed.errors import ConfigError
from rlspeed.validation import check
from tests.conftest import learner_cfg, run_cli, saved_agent, without_rates
from tests.test_resume import _cut_after_first_log
from tests.test_vpg import _copy_flax_to_torch

SETTINGS = NormSettings(normalize_obs=True, obs_clip=4.0, scale_rewards=True, reward_clip=2.0)
OPTIONS = ["algo.normalize_obs=true", "algo.scale_rewards=true", "algo.orthogonal_init=true"]


def _observation_stream(rng: np.random.Generator, steps: int, envs: int) -> list[np.ndarray]:
    """Per step, every env's observation: entries on very different scales (an outlier
    among them, so clipping happens)."""
    scales = np.array([1.0, 100.0, 0.01], dtype=np.float32)
    stream = [(rng.normal(3.0, 1.0, (envs, 3)) * scales).astype(np.float32) for _ in range(steps)]
    stream[-1][0, 0] = 1e3
    return stream


def test_observation_statistics_are_numpys_mean_and_var_of_all_seen_on_host_and_fused():
    stream = _observation_stream(np.random.default_rng(0), 6, 4)
    host = HostNormalization(SETTINGS, (3,), 4, 0.99)
    fused = init_state(SETTINGS, (3,), 4, jnp)
    for t, obs in enumerate(stream):
        seen = host.observe(obs)
        fused, fused_seen = jax.jit(observe, static_argnums=(0, 3))(SETTINGS, fused, obs, jnp)
        everything = np.concatenate(stream[: t + 1]).astype(np.float64)
        mean, var = everything.mean(axis=0), everything.var(axis=0)
        assert host.state.obs.count == everything.shape[0] == fused.obs.count
        np.testing.assert_allclose(host.state.obs.mean, mean, rtol=1e-5)
        np.testing.assert_allclose(host.state.obs.var, var, rtol=1e-4)
        expected = np.clip((obs - mean) / np.sqrt(var + EPS), -4.0, 4.0)
        np.testing.assert_allclose(seen, expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(fused_seen), seen, rtol=1e-4, atol=1e-5)
    assert seen[0, 0] == 4.0, "the outlier is clipped"
    # Normalising (final observations, evaluation) counts nothing.
    host.normalize(stream[0])
    assert host.state.obs.count == 24


def test_reward_scaling_divides_by_the_running_std_of_the_discounted_return():
    gamma = 0.9
    rewards = np.array([[1.0, -2.0], [0.5, 4.0], [3.0, 0.0], [-1.0, 30.0]], dtype=np.float32)
    dones = np.array([[False, False], [True, False], [False, False], [False, True]])
    host = HostNormalization(SETTINGS, (3,), 2, gamma)
    fused = init_state(SETTINGS, (3,), 2, jnp)
    # By hand: each env's discounted return, restarted after an episode's end; every return
    # seen so far makes the variance the rewards are divided by.
    returns, seen = np.zeros(2), []
    for reward, done in zip(rewards, dones, strict=True):
        returns = returns * gamma + reward
        seen += list(returns)
        expected = np.clip(reward / math.sqrt(np.var(seen) + EPS), -2.0, 2.0)
        np.testing.assert_allclose(host.rewards(reward, done), expected, rtol=1e-5)
        fused, scaled = scale_rewards(SETTINGS, fused, jnp.asarray(reward), done, gamma, jnp)
        np.testing.assert_allclose(np.asarray(scaled), expected, rtol=1e-5)
        returns[done] = 0.0
    assert expected[1] == 2.0, "the last reward, 30, is clipped"


def _spaces() -> tuple[gym.Space, gym.Space]:
    env = gym.make("Pendulum-v1")
    return env.observation_space, env.action_space


def _assert_orthogonal(weight: np.ndarray, gain: float) -> None:
    """``weight`` [out, in] has orthogonal rows or columns (whichever are fewer) of norm gain."""
    small = weight @ weight.T if weight.shape[0] <= weight.shape[1] else weight.T @ weight
    np.testing.assert_allclose(small, gain**2 * np.eye(len(small)), atol=1e-5 * max(1, gain**2))


def test_orthogonal_init_has_orthonormal_weights_with_cleanrls_gains_on_both_backends():
    algo = PPOConfig(hidden_sizes=[64, 32])
    obs_space, action_space = _spaces()
    flax_nets = FlaxActorCritic(obs_space, action_space, algo, orthogonal=True)
    policy, value = flax_nets.init_params(jax.random.key(0))
    torch_nets = TorchActorCritic(obs_space, action_space, algo, seed=0, orthogonal=True)
    torch_layers = {
        "policy": [m for m in torch_nets.policy.net.net if isinstance(m, torch.nn.Linear)],
        "value": [m for m in torch_nets.value.net if isinstance(m, torch.nn.Linear)],
    }
    flax_layers = {"policy": policy["params"]["MLP_0"], "value": value["params"]}
    for name, output_gain in (("policy", 0.01), ("value", 1.0)):
        gains = [math.sqrt(2), math.sqrt(2), output_gain]
        for i, gain in enumerate(gains):
            dense = flax_layers[name][f"Dense_{i}"]
            _assert_orthogonal(np.asarray(dense["kernel"]).T, gain)
            assert not np.asarray(dense["bias"]).any()
            layer = torch_layers[name][i]
            _assert_orthogonal(layer.weight.detach().numpy(), gain)
            assert not layer.bias.detach().numpy().any()
    # Off: the LeCun init as before (not orthogonal).
    plain = FlaxActorCritic(obs_space, action_space, algo).init_params(jax.random.key(0))[1]
    kernel = np.asarray(plain["params"]["Dense_1"]["kernel"]).T
    assert not np.allclose(kernel @ kernel.T, 2 * np.eye(32), atol=0.1)


def test_torch_and_flax_learners_normalise_and_act_alike():
    """The same weights (flax's copied to torch) and the same observations: both backends'
    learners count them alike and take the same greedy actions on them."""
    algo = PPOConfig(
        hidden_sizes=[32], normalize_obs=True, scale_rewards=True, orthogonal_init=True
    )
    cfg = learner_cfg(OmegaConf.structured(algo), total_steps=256, num_envs=4)
    obs_space, action_space = _spaces()
    flax_learner = FlaxLearner(obs_space, action_space, cfg, seed=0)
    torch_learner = TorchLearner(obs_space, action_space, cfg, seed=0)
    _copy_flax_to_torch(flax_learner, torch_learner)
    for obs in _observation_stream(np.random.default_rng(1), 5, 4):
        flax_seen = flax_learner.normalization.observe(obs)
        torch_seen = torch_learner.normalization.observe(obs)
        np.testing.assert_array_equal(flax_seen, torch_seen)
        np.testing.assert_allclose(
            flax_learner.greedy(obs), torch_learner.greedy(obs), rtol=1e-5, atol=1e-6
        )
    # The greedy actions are taken on normalised observations.
    raw = flax_learner._greedy(flax_learner.agent.policy_params, obs)
    assert not np.allclose(flax_learner.greedy(obs), np.asarray(raw))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task=doors", "algo.normalize_obs=true"],
            "algo.normalize_obs=True: expected false on doors, whose observations are categorical",
        ),
        (["task=pendulum", "algo.obs_clip=0.0"], "algo.obs_clip=0.0: expected a finite number > 0"),
        (["task=cartpole", "algo.reward_clip=inf"], "algo.reward_clip=inf: expected a finite"),
    ],
    ids=["categorical-obs", "obs_clip", "reward_clip"],
)
def test_bad_option_is_one_clear_line(make_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check(make_cfg(["algo=ppo", *overrides]))


# ---------------------------------------------------------------- runs: checkpoint, resume

RUN = [
    "algo=ppo",
    "task=pendulum",
    "tracking=none",
    "progress=plain",
    "num_envs=4",
    "algo.num_steps=64",
    "algo.hidden_sizes=[16]",
    "task.eval_episodes=2",
]


@pytest.mark.slow  # 15 s on 2 cores: the default selection stays under 5 minutes
@pytest.mark.parametrize(
    ("backend", "engine"), [("torch", "gym-sync"), ("flax", "gym-sync"), ("flax", "jax-vmap")]
)
def test_the_checkpoint_keeps_the_statistics_and_eval_scores_with_them(backend, engine, tmp_path):
    """Pendulum's defaults turn the options on: the agent file holds the statistics of all
    2048 observations acted on, and ``mode=eval`` scores the agent as training's final
    evaluation did, which it would not without them."""
    args = [*RUN, f"backend={backend}", f"env={engine}", "total_steps=2048", "log_every=1024"]
    trained = run_cli([*args, "eval_every=2048", "hydra.run.dir=run"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    config = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert config.algo.normalize_obs and config.algo.scale_rewards and config.algo.orthogonal_init
    if backend == "torch":
        stats = read_agent(tmp_path / "run" / "checkpoint.pt", "torch")["obs_norm"]
    else:
        saved = (tmp_path / "run" / "checkpoint.msgpack").read_bytes()
        stats = flax.serialization.msgpack_restore(saved)["obs_norm"]
    assert float(stats["count"]) == 2048
    assert np.all(np.asarray(stats["var"]) > 0.01) and np.all(np.asarray(stats["var"]) != 1)
    score = json.loads((tmp_path / "run" / "metrics.json").read_text())["score"]
    evaluated = run_cli(["mode=eval", "checkpoint=run", "hydra.run.dir=eval"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    # Equal up to float32 rounding of a sum of 400 rewards (the printed 4th decimal can
    # differ); without the statistics the policy acts on other inputs and scores otherwise.
    printed = float(evaluated.stdout.split("rlspeed: score ")[1].split()[0])
    assert printed == pytest.approx(score, rel=1e-6, abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "engine"), [("torch", "gym-sync"), ("flax", "gym-sync"), ("flax", "jax-vmap")]
)
def test_a_resumed_run_with_the_options_on_ends_like_the_whole_one(backend, engine, tmp_path):
    """Cut by SIGTERM after its first log and resumed, a run with every option on ends with
    the uninterrupted run's numbers, agent file and statistics, bit for bit."""
    args = [*RUN, *OPTIONS, f"backend={backend}", f"env={engine}"]
    args += ["total_steps=4096", "log_every=1024", "eval_every=4096"]
    whole = run_cli([*args, "hydra.run.dir=whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    _cut_after_first_log([*args, "hydra.run.dir=cut"], tmp_path)
    cut = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert cut["status"] == "KILLED" and 0 < cut["env_steps"] < 4096
    resumed = run_cli([*args, "resume=cut", "hydra.run.dir=resumed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "resumed"))
    same = ("score", "recent_return", "env_steps", "gradient_updates")
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    rows = [[without_rates(row) for row in m["history"]] for m in (a, b)]
    assert rows[0] == rows[1]
    assert saved_agent(tmp_path / "whole") == saved_agent(tmp_path / "resumed")
