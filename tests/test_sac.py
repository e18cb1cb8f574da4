"""SAC: torch and flax compute the same updates, the policy's log-probabilities are the
squashed Gaussian's, torch and the fused program learn Pendulum, and incompatible choices
fail with one line."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed.core.algos.replay import Batch
from rlspeed.core.algos.sac import SACConfig, draw_normal, sample
from rlspeed.core.algos.sac.flax import FlaxLearner
from rlspeed.core.algos.sac.torch import TorchLearner
from rlspeed.core.algos.td3 import action_bounds
from rlspeed.errors import ConfigError
from rlspeed.validation import check
from tests.conftest import (
    assert_carried_noise_restarts_and_resumes,
    assert_ou_moments,
    learner_cfg,
    run_in,
)

# A deliberately lopsided action box: the tanh scaling must map onto [low, high] exactly.
BOX_OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX_ACTIONS = gym.spaces.Box(np.float32([0.0, -1.0]), np.float32([1.0, 3.0]))


def _learners(algo: SACConfig) -> tuple[FlaxLearner, TorchLearner]:
    cfg = learner_cfg(algo)
    return (
        FlaxLearner(BOX_OBS, BOX_ACTIONS, cfg, seed=0),
        TorchLearner(BOX_OBS, BOX_ACTIONS, cfg, seed=0),
    )


def _dense_layers(params, critic: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(kernel as torch's [out, in], bias) per Dense layer; ``critic`` picks Q1/Q2 of a stack."""
    dense = params["params"]
    pick = (lambda x: np.asarray(x)) if critic is None else (lambda x: np.asarray(x)[critic])
    return [
        (pick(dense[f"Dense_{i}"]["kernel"]).T, pick(dense[f"Dense_{i}"]["bias"]))
        for i in range(len(dense))
    ]


def _torch_layers(network: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in network.modules() if isinstance(m, torch.nn.Linear)]


def _pairs(flax_learner: FlaxLearner, torch_learner: TorchLearner):
    """(flax params, critic index, torch network) for every network of the agent."""
    agent = flax_learner.agent
    t = torch_learner
    return [
        (agent.actor_params, None, t.actor),
        (agent.critic_params, 0, t.qf1),
        (agent.critic_params, 1, t.qf2),
        (agent.critic_target, 0, t.qf1_target),
        (agent.critic_target, 1, t.qf2_target),
    ]


def _batch(rng: np.random.Generator, n: int) -> Batch[np.ndarray]:
    return Batch(
        rng.uniform(-1, 1, (n, 3)).astype(np.float32),
        rng.uniform(-1, 1, (n, 3)).astype(np.float32),
        rng.uniform(BOX_ACTIONS.low, BOX_ACTIONS.high, (n, 2)).astype(np.float32),
        rng.normal(size=n).astype(np.float32),
        (rng.random(n) < 0.2).astype(np.float32),
    )


@pytest.mark.parametrize("autotune", [True, False])
def test_torch_and_flax_compute_the_same_updates(autotune):
    algo = SACConfig(
        hidden_sizes=[32, 32], q_lr=1e-2, policy_lr=1e-2, tau=0.5, alpha=0.5, autotune=autotune
    )
    flax_learner, torch_learner = _learners(algo)
    for params, critic, network in _pairs(flax_learner, torch_learner):
        with torch.no_grad():
            for (kernel, bias), linear in zip(
                _dense_layers(params, critic), _torch_layers(network), strict=True
            ):
                linear.weight.copy_(torch.from_numpy(kernel.copy()))
                linear.bias.copy_(torch.from_numpy(bias.copy()))
    initial_target = _dense_layers(flax_learner.agent.critic_target, 0)[0][0]

    rng = np.random.default_rng(0)
    n = 64
    batch = _batch(rng, n)
    np.testing.assert_allclose(
        flax_learner.greedy(batch.obs), torch_learner.greedy(batch.obs), atol=1e-5
    )
    critic_metrics = {
        f"losses/{name}"
        for name in ("qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "alpha")
    }
    policy_metrics = {"losses/actor_loss"} | ({"losses/alpha_loss"} if autotune else set())
    for update in range(1, 5):  # updates 2 and 4 also take two policy steps each
        # The same draws for both: the next actions', then each policy step's.
        noise = rng.normal(size=(3, n, 2)).astype(np.float32)
        flax_metrics = flax_learner.update(batch, noise=noise)
        torch_metrics = torch_learner.update(batch, noise=noise)
        expected = critic_metrics | (policy_metrics if update % 2 == 0 else set())
        assert flax_metrics.keys() == torch_metrics.keys() == expected
        for name, value in flax_metrics.items():
            np.testing.assert_allclose(
                float(value), float(torch_metrics[name]), rtol=1e-4, err_msg=name
            )
    for params, critic, network in _pairs(flax_learner, torch_learner):
        for (kernel, bias), linear in zip(
            _dense_layers(params, critic), _torch_layers(network), strict=True
        ):
            np.testing.assert_allclose(kernel, linear.weight.detach().numpy(), atol=1e-5)
            np.testing.assert_allclose(bias, linear.bias.detach().numpy(), atol=1e-5)
    log_alpha = float(flax_learner.agent.log_alpha)
    np.testing.assert_allclose(log_alpha, float(torch_learner.log_alpha.value.detach()), atol=1e-6)
    # The entropy coefficient moved only where it is tuned; the targets moved.
    assert (log_alpha != pytest.approx(np.log(0.5))) == autotune
    assert not np.allclose(_dense_layers(flax_learner.agent.critic_target, 0)[0][0], initial_target)


def test_log_probabilities_are_the_squashed_gaussians():
    """``sample``'s log-probability is the density of the action it returns: the Gaussian's
    (torch.distributions) through tanh and the affine map onto the box (where the action is
    not saturated: there the epsilon that keeps its log finite dominates)."""
    rng = np.random.default_rng(1)
    out = torch.from_numpy(rng.normal(size=(500, 4)))
    normal = torch.from_numpy(rng.normal(size=(500, 2)))
    bounds = action_bounds(BOX_ACTIONS, lambda x: torch.from_numpy(x.astype(np.float64)))
    actions, log_prob = sample(out, normal, bounds, torch)
    mean, raw = out[:, :2], out[:, 2:]
    std = torch.exp(-5.0 + 3.5 * (torch.tanh(raw) + 1))  # log std rescaled onto [-5, 2]
    pre_tanh = mean + std * normal
    np.testing.assert_allclose(actions, torch.tanh(pre_tanh) * bounds.scale + bounds.center)
    gaussian = torch.distributions.Normal(mean, std).log_prob(pre_tanh)
    slope = bounds.scale * (1 - torch.tanh(pre_tanh) ** 2)  # d action / d pre_tanh
    unsaturated = (slope > 1e-2).all(1)
    assert unsaturated.sum() > 300
    expected = (gaussian - torch.log(slope)).sum(1)
    np.testing.assert_allclose(log_prob[unsaturated], expected[unsaturated], atol=1e-3)
    assert (actions >= bounds.low).all() and (actions <= bounds.high).all()


@pytest.mark.parametrize("backend", ["torch", "flax"])
def test_actions_stay_inside_the_action_box(backend):
    flax_learner, torch_learner = _learners(SACConfig(hidden_sizes=[16], learning_starts=100))
    learner = flax_learner if backend == "flax" else torch_learner
    obs = np.random.default_rng(0).uniform(-1, 1, (2000, 3)).astype(np.float32)
    for step in (0, 100):  # uniformly random actions, then the policy's samples
        actions = np.asarray(learner.act(obs, step))
        assert actions.dtype == np.float32 and actions.shape == (2000, 2)
        assert (actions >= BOX_ACTIONS.low).all() and (actions <= BOX_ACTIONS.high).all()
    random = np.asarray(learner.act(obs, 0))
    np.testing.assert_allclose(random.mean(axis=0), [0.5, 1.0], atol=0.1)
    greedy = learner.greedy(obs)
    assert (greedy >= BOX_ACTIONS.low).all() and (greedy <= BOX_ACTIONS.high).all()


# Seconds per stack: 4000 env steps, small networks, fast targets and a short horizon (as
# TD3's test). Measured: greedy scores -204 (torch + gym-sync) and -138 to -156 (3 fused
# seeds); a random policy scores about -1250 (tests/test_td3.py).
SMALL_PENDULUM = [
    "algo=sac",
    "task=pendulum",
    "num_envs=8",
    "total_steps=4000",
    "log_every=1000",
    "eval_every=4000",
    "algo.learning_starts=300",
    "algo.q_lr=0.003",
    "algo.policy_lr=0.001",
    "algo.gamma=0.95",
    "algo.tau=0.05",
    "algo.batch_size=64",
    "algo.hidden_sizes=[32,32]",
    "tracking=none",
    "progress=none",
]
LEARNED = -600.0
SAC_METRICS = {
    f"losses/{name}"
    for name in ("qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss")
    + ("actor_loss", "alpha", "alpha_loss")
}


@pytest.mark.slow
def test_torch_learns_pendulum(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg(["backend=torch", "env=gym-sync", *SMALL_PENDULUM])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    assert metrics["score"] > LEARNED, metrics["score"]
    assert metrics["env_steps"] == 4000 and metrics["gradient_updates"] == 4000 - 300
    assert metrics["final"].keys() >= SAC_METRICS
    assert all(np.isfinite(metrics["final"][name]) for name in SAC_METRICS)


@pytest.mark.slow  # 15 s; TD3's fused seeds test runs the same program in the default selection
def test_fused_stack_learns_pendulum_with_seeds_in_one_program(make_cfg, tmp_path, monkeypatch):
    """flax + jax-vmap: three seeds train as one vmapped program; each learns, differently."""
    cfg = make_cfg(["backend=flax", "env=jax-vmap", *SMALL_PENDULUM, "num_seeds=3"])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    scores = [seed["score"] for seed in metrics["seeds"]]
    assert len(set(scores)) == 3, scores
    assert min(scores) > LEARNED, scores
    assert metrics["env_steps"] == 3 * 4000 and metrics["gradient_updates"] == 3 * (4000 - 300)
    assert metrics["final"].keys() >= SAC_METRICS
    # The entropy coefficient was tuned down from its start as the policy narrowed.
    assert metrics["final"]["losses/alpha"] < 0.2


PENDULUM = ["task=pendulum"]


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["task=cartpole"], ["invalid algo=sac", "discrete actions on task=cartpole"]),
        (
            ["task=gym", "env=gym-sync", "task.id=CartPole-v1"],
            ["invalid algo=sac", "actions, Discrete(2)", "needs bounded 1-D Box actions"],
        ),
        ([*PENDULUM, "algo.policy_frequency=0"], ["algo.policy_frequency=0", ">= 1"]),
        ([*PENDULUM, "algo.alpha=0"], ["algo.alpha=0", "> 0"]),
        ([*PENDULUM, "algo.tau=1.5"], ["algo.tau=1.5", "(0, 1]"]),
        ([*PENDULUM, "algo.q_lr=-1"], ["algo.q_lr=-1", "> 0"]),
        ([*PENDULUM, "algo.batch_size=5000"], ["algo.batch_size=5000", "<= algo.buffer_size"]),
        ([*PENDULUM, "algo.exploration=pink"], ["algo.exploration=pink", "one of gaussian, ou"]),
        ([*PENDULUM, "algo.ou_theta=200"], ["algo.ou_theta=200", "ou_theta * ou_dt <= 1"]),
    ],
)
def test_bad_choices_are_one_line(overrides, fragments, make_cfg):
    cfg = make_cfg(["algo=sac", "algo.buffer_size=1000", *overrides])
    with pytest.raises(ConfigError) as error:
        check(cfg)
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_ou_draws_keep_unit_variance_and_correlate_from_step_to_step():
    """algo.exploration=ou: from 0, after k steps each draw has variance 1 - a^(2k),
    a = 1 - theta dt (so the policy's own spread once the process has run), and neighbouring
    steps correlate by a times their std ratio; Gaussian draws are the fresh ones as they
    come, the carried ones untouched."""
    ou = SACConfig(exploration="ou", ou_theta=1.0, ou_dt=0.1)
    assert_ou_moments(draw_normal, ou, steps=8, variance=1 - 0.9**16)
    rng = np.random.default_rng(1)
    carried = np.zeros((20_000, 1))
    fresh = rng.standard_normal(carried.shape)
    drawn, untouched = draw_normal(carried, fresh, SACConfig())
    assert drawn is fresh and untouched is carried


@pytest.mark.parametrize("backend", ["torch", "flax"])
def test_ou_draws_make_the_actions_and_restart_with_each_episode(backend):
    """A host learner samples its policy with the draws it carries, keeps them from step to
    step and zeroes an env's row where its episode ended; before learning_starts they stay 0;
    the resume state carries them."""
    algo = SACConfig(hidden_sizes=[16], learning_starts=2, exploration="ou", ou_dt=0.5)
    cfg = learner_cfg(algo, num_envs=3)
    make = FlaxLearner if backend == "flax" else TorchLearner
    learner = make(BOX_OBS, BOX_ACTIONS, cfg, seed=0)
    obs = np.zeros((3, 3), np.float32)
    learner.act(obs, 0)
    assert not np.asarray(learner.noise).any()
    draws = []
    for step in (2, 3, 4):
        actions = np.asarray(learner.act(obs, step))
        carried = np.asarray(learner.noise).copy()
        if backend == "flax":
            expected = learner.fns.policy(learner.agent.actor_params, obs, carried)[0]
        else:
            with torch.no_grad():
                expected = learner.actor(torch.from_numpy(obs), torch.from_numpy(carried))[0]
        np.testing.assert_allclose(actions, np.asarray(expected), atol=1e-6)
        draws.append(carried)
    assert not np.allclose(draws[-1], draws[-2])
    assert_carried_noise_restarts_and_resumes(learner, make(BOX_OBS, BOX_ACTIONS, cfg, seed=1))
