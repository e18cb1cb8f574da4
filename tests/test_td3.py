"""TD3: torch and flax compute the same updates, every stack learns Pendulum, HalfCheetah
runs, and incompatible choices fail with one line."""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import rlspeed
from rlspeed.core.algos import import_named
from rlspeed.core.algos.replay import Batch
from rlspeed.core.algos.td3 import TD3Config, draw_noise
from rlspeed.core.algos.td3.flax import FlaxLearner
from rlspeed.core.algos.td3.torch import TorchLearner
from rlspeed.core.envs.vmap import make_vmap_env
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS, TASKS
from rlspeed.seeding import jax_keys
from rlspeed.validation import check
from tests.conftest import (
    assert_carried_noise_restarts_and_resumes,
    assert_ou_moments,
    learner_cfg,
    run_in,
    saved_agent,
)

# A deliberately lopsided action box: the tanh scaling must map onto [low, high] exactly.
BOX_OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX_ACTIONS = gym.spaces.Box(np.float32([0.0, -1.0]), np.float32([1.0, 3.0]))


def _learners(algo: TD3Config) -> tuple[FlaxLearner, TorchLearner]:
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


def _torch_layers(network: torch.nn.Module) -> list[tuple[np.ndarray, np.ndarray]]:
    linears = [m for m in network.net if isinstance(m, torch.nn.Linear)]
    return [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in linears]


def _pairs(flax_learner: FlaxLearner, torch_learner: TorchLearner):
    """(flax params, critic index, torch network) for every network of the agent."""
    agent = flax_learner.agent
    t = torch_learner
    return [
        (agent.actor_params, None, t.actor),
        (agent.actor_target, None, t.actor_target),
        (agent.critic_params, 0, t.qf1),
        (agent.critic_params, 1, t.qf2),
        (agent.critic_target, 0, t.qf1_target),
        (agent.critic_target, 1, t.qf2_target),
    ]


def test_torch_and_flax_compute_the_same_updates():
    algo = TD3Config(hidden_sizes=[32, 32], learning_rate=1e-2, tau=0.5, policy_frequency=2)
    flax_learner, torch_learner = _learners(algo)
    for params, critic, network in _pairs(flax_learner, torch_learner):
        linears = [m for m in network.net if isinstance(m, torch.nn.Linear)]
        with torch.no_grad():
            for (kernel, bias), linear in zip(_dense_layers(params, critic), linears, strict=True):
                linear.weight.copy_(torch.from_numpy(kernel.copy()))
                linear.bias.copy_(torch.from_numpy(bias.copy()))
    initial_target = _dense_layers(flax_learner.agent.actor_target)[0][0]

    rng = np.random.default_rng(0)
    n = 64
    batch = Batch(
        rng.uniform(-1, 1, (n, 3)).astype(np.float32),
        rng.uniform(-1, 1, (n, 3)).astype(np.float32),
        rng.uniform(BOX_ACTIONS.low, BOX_ACTIONS.high, (n, 2)).astype(np.float32),
        rng.normal(size=n).astype(np.float32),
        (rng.random(n) < 0.2).astype(np.float32),
    )
    np.testing.assert_allclose(
        flax_learner.greedy(batch.obs), torch_learner.greedy(batch.obs), atol=1e-5
    )
    critic_metrics = {"losses/qf1_loss", "losses/qf2_loss", "losses/qf1_values"}
    for update in range(1, 5):  # updates 2 and 4 also move the actor and the targets
        noise = rng.normal(size=(n, 2)).astype(np.float32)  # the same smoothing noise for both
        flax_metrics = flax_learner.update(batch, noise=noise)
        torch_metrics = torch_learner.update(batch, noise=noise)
        expected = critic_metrics | ({"losses/actor_loss"} if update % 2 == 0 else set())
        assert flax_metrics.keys() == torch_metrics.keys() == expected
        for name, value in flax_metrics.items():
            np.testing.assert_allclose(float(value), float(torch_metrics[name]), rtol=1e-4)
    for params, critic, network in _pairs(flax_learner, torch_learner):
        for flax_layer, torch_layer in zip(
            _dense_layers(params, critic), _torch_layers(network), strict=True
        ):
            for a, b in zip(flax_layer, torch_layer, strict=True):
                np.testing.assert_allclose(a, b, atol=1e-5)
    # The delayed steps moved the targets too: not a comparison of untouched copies.
    assert not np.allclose(_dense_layers(flax_learner.agent.actor_target)[0][0], initial_target)


@pytest.mark.parametrize("backend", ["torch", "flax"])
def test_actions_stay_inside_the_action_box(backend):
    flax_learner, torch_learner = _learners(TD3Config(hidden_sizes=[16], learning_starts=100))
    learner = flax_learner if backend == "flax" else torch_learner
    obs = np.random.default_rng(0).uniform(-1, 1, (2000, 3)).astype(np.float32)
    for step in (0, 100):  # uniformly random actions, then the actor's plus noise
        actions = np.asarray(learner.act(obs, step))
        assert actions.dtype == np.float32 and actions.shape == (2000, 2)
        assert (actions >= BOX_ACTIONS.low).all() and (actions <= BOX_ACTIONS.high).all()
    random = np.asarray(learner.act(obs, 0))
    np.testing.assert_allclose(random.mean(axis=0), [0.5, 1.0], atol=0.1)
    greedy = learner.greedy(obs)
    assert (greedy >= BOX_ACTIONS.low).all() and (greedy <= BOX_ACTIONS.high).all()


# Seconds per stack: 4000 env steps, small networks, fast targets and a short horizon. At
# 3000 steps 8 of 8 fused seeds scored -100 to -171, but torch + jax-vmap scored -699 once
# the envs drew from a Philox stream (other start states): 4000 gives the margin back.
SMALL_PENDULUM = [
    "algo=td3",
    "task=pendulum",
    "num_envs=8",
    "total_steps=4000",
    "log_every=1000",
    "eval_every=4000",
    "algo.learning_starts=300",
    "algo.learning_rate=0.003",
    "algo.gamma=0.95",
    "algo.tau=0.05",
    "algo.batch_size=64",
    "algo.hidden_sizes=[32,32]",
    "tracking=none",
    "progress=none",
]
# Clearly above a random policy's score (about -1250; see _random_pendulum_score).
LEARNED = -600.0


def _random_pendulum_score(make_cfg) -> float:
    rng = np.random.default_rng(0)
    task_cfg = make_cfg(SMALL_PENDULUM).task
    return TASKS.get("pendulum").evaluate(
        task_cfg, lambda obs: rng.uniform(-2, 2, (len(obs), 1)).astype(np.float32), 0
    )


def test_random_policy_scores_far_below_the_learning_bar(make_cfg):
    assert _random_pendulum_score(make_cfg) < LEARNED - 500


HOST_DRIVEN = [("torch", "gym-sync"), ("torch", "gym-async"), ("torch", "jax-vmap")]
HOST_DRIVEN += [("flax", "gym-sync"), ("flax", "gym-async")]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "engine"), HOST_DRIVEN)
def test_host_driven_stacks_learn_pendulum(backend, engine, make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg([f"backend={backend}", f"env={engine}", *SMALL_PENDULUM])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    assert metrics["score"] > LEARNED, (backend, engine, metrics["score"])
    assert metrics["env_steps"] == 4000 and metrics["gradient_updates"] == 4000 - 300
    assert np.isfinite(metrics["final"]["losses/actor_loss"])


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_fused_stack_learns_pendulum_with_seeds_in_one_program(make_cfg, tmp_path, monkeypatch):
    """flax + jax-vmap: two seeds train as one vmapped program; each learns, differently."""
    cfg = make_cfg(["backend=flax", "env=jax-vmap", *SMALL_PENDULUM, "num_seeds=2"])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    scores = [seed["score"] for seed in metrics["seeds"]]
    assert len(set(scores)) == 2, scores
    assert min(scores) > LEARNED, scores
    assert metrics["score"] == pytest.approx(np.mean(scores))
    assert metrics["env_steps"] == 2 * 4000 and metrics["gradient_updates"] == 2 * (4000 - 300)
    # One program: one checkpoint with both agents' parameters side by side.
    assert [p.name for p in (tmp_path / "run").glob("checkpoint*")] == ["checkpoint.msgpack"]


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("algo.policy_frequency=0", ["algo.policy_frequency=0", ">= 1"]),
        ("algo.batch_size=5000", ["algo.batch_size=5000", "<= algo.buffer_size (1000)"]),
        ("algo.tau=1.5", ["algo.tau=1.5", "(0, 1]"]),
        ("algo.noise_clip=-0.1", ["algo.noise_clip=-0.1", ">= 0"]),
        ("algo.hidden_sizes=[]", ["algo.hidden_sizes=[]", "non-empty"]),
        ("algo.exploration=pink", ["algo.exploration=pink", "one of gaussian, ou"]),
        ("algo.ou_dt=0", ["algo.ou_dt=0", "> 0"]),
        ("algo.ou_theta=200", ["algo.ou_theta=200", "ou_theta * ou_dt <= 1"]),
    ],
)
def test_bad_hyperparameters_are_named(override, fragments, make_cfg):
    cfg = make_cfg(["algo=td3", "task=pendulum", "algo.buffer_size=1000", override])
    with pytest.raises(ConfigError) as error:
        check(cfg)
    for fragment in fragments:
        assert fragment in str(error.value)


def test_torch_reads_jax_actions_and_observations():
    """backend=torch env=jax-vmap: float32 observations and actions cross by DLPack."""
    obs = jax.numpy.ones((4, 3), jax.numpy.float32)
    _, torch_learner = _learners(TD3Config(hidden_sizes=[16], learning_starts=0))
    actions = torch_learner.act(obs, 0)
    assert actions.dtype == torch.float32
    assert jax.dlpack.from_dlpack(actions).shape == (4, 2)


def test_ou_noise_has_the_processs_closed_form_moments():
    """algo.exploration=ou: from 0, after k steps each entry has variance
    sigma^2 dt (1 - a^(2k)) / (1 - a^2), a = 1 - theta dt, and neighbouring steps correlate
    by a times their std ratio; Gaussian noise has std sigma and no memory."""
    ou = TD3Config(exploration="ou", exploration_noise=0.5, ou_theta=0.15, ou_dt=0.01)
    kept = 1 - 0.15 * 0.01
    variance = 0.25 * 0.01 * (1 - kept**600) / (1 - kept**2)
    assert_ou_moments(draw_noise, ou, steps=300, variance=variance)
    rng = np.random.default_rng(1)
    # Gaussian: each step's draw scaled by sigma, the carried noise untouched.
    gaussian = TD3Config(exploration_noise=0.5)
    carried = np.ones((20_000, 1))
    drawn, kept_noise = draw_noise(carried, rng.standard_normal(carried.shape), gaussian)
    assert kept_noise is carried and np.std(drawn) == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize("backend", ["torch", "flax"])
def test_ou_noise_moves_the_actions_and_restarts_with_each_episode(backend):
    """A host learner acts with the noise it carries (the actor's action plus noise times
    half the range), keeps it from step to step and zeroes an env's row where its episode
    ended; before learning_starts the noise stays 0."""
    algo = TD3Config(
        hidden_sizes=[16], learning_starts=2, exploration="ou", exploration_noise=0.5, ou_dt=0.5
    )
    cfg = learner_cfg(algo, num_envs=3)
    make = FlaxLearner if backend == "flax" else TorchLearner
    learner = make(BOX_OBS, BOX_ACTIONS, cfg, seed=0)
    obs = np.zeros((3, 3), np.float32)
    learner.act(obs, 0)
    assert not np.asarray(learner.noise).any()
    scale = (BOX_ACTIONS.high - BOX_ACTIONS.low) / 2
    noises = []
    for step in (2, 3, 4):
        actions = np.asarray(learner.act(obs, step))
        noise = np.asarray(learner.noise).copy()
        expected = np.clip(learner.greedy(obs) + noise * scale, BOX_ACTIONS.low, BOX_ACTIONS.high)
        np.testing.assert_allclose(actions, expected, atol=1e-6)
        noises.append(noise)
    assert not np.allclose(noises[-1], noises[-2])
    assert_carried_noise_restarts_and_resumes(learner, make(BOX_OBS, BOX_ACTIONS, cfg, seed=1))


@pytest.mark.slow  # compiling the fused program is most of its 10 s
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_fused_ou_noise_restarts_where_episodes_end(algo, make_cfg):
    """env=jax-vmap: the program carries the OU noise (SAC: its OU draws) per env and zeroes
    it when the env's episode ends (here every 3 steps)."""
    cfg = OmegaConf.to_object(
        make_cfg(
            [
                f"algo={algo}", "task=pendulum", "task.max_steps=3", "num_envs=2",
                "total_steps=8", "algo.learning_starts=0", "algo.exploration=ou",
                "algo.ou_dt=0.5", "algo.hidden_sizes=[8]", "algo.batch_size=2",
                "algo.buffer_size=16",
            ]
        )
    )  # fmt: skip
    env = make_vmap_env(TASKS.get("pendulum"), cfg.task, cfg.num_envs)
    trainer = import_named(ALGOS.get(algo).fused)(cfg, env)
    state = jax.jit(trainer.init)(jax_keys(0))
    assert state.noise.shape == (2, 1) and not state.noise.any()
    run = jax.jit(trainer.run, static_argnums=1)
    state, stats = run(state, 2, 2)
    assert np.abs(np.asarray(state.noise)).min() > 0 and not stats.done.any()
    state, stats = run(state, 1, 1)
    assert stats.done.all() and not state.noise.any()


@pytest.mark.slow  # three fused programs compiled per algorithm
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_a_fused_run_with_ou_exploration_extended_ends_like_the_longer_one(algo, tmp_path):
    """env=jax-vmap with OU exploration, cut in mid-episode (150 of Pendulum's 200 steps per
    env) and extended with ``resume=``: the carried noise comes back with the rest of the
    program's state, so the agent ends as the uninterrupted run's does, bit for bit."""
    args = {
        "algo": algo, "task": "pendulum", "backend": "flax", "env": "jax-vmap",
        "num_envs": 2, "tracking": "none", "progress": "none", "log_every": 100,
        "eval_every": 600, "algo.exploration": "ou", "algo.ou_dt": 0.5,
        "algo.hidden_sizes": [8], "algo.learning_starts": 20, "algo.buffer_size": 600,
        "algo.batch_size": 8,
    }  # fmt: skip
    whole = rlspeed.train(**args, total_steps=600, out_dir=tmp_path / "whole")
    first = rlspeed.train(**args, total_steps=300, out_dir=tmp_path / "first")
    extended = rlspeed.train(
        **args, total_steps=600, resume=str(first.output_dir), out_dir=tmp_path / "more"
    )
    assert saved_agent(extended.output_dir) == saved_agent(whole.output_dir)
    assert extended.metrics["score"] == whole.metrics["score"]


def _flag_reached(algo: TD3Config, envs: int = 64) -> float:
    """The fraction of MountainCarContinuous-v0 episodes that reach the flag driven by
    ``algo``'s exploration noise alone (an actor that outputs 0), as a run draws it."""
    vector = gym.make_vec("MountainCarContinuous-v0", num_envs=envs, vectorization_mode="sync")
    vector.reset(seed=0)
    rng = np.random.default_rng(0)
    noise = np.zeros((envs, 1), np.float32)
    reached = np.zeros(envs, bool)
    for _ in range(999):  # one episode: the id's time limit
        drawn, noise = draw_noise(noise, rng.standard_normal(noise.shape), algo)
        _, _, terminated, _, _ = vector.step(np.clip(drawn, -1.0, 1.0).astype(np.float32))
        reached |= terminated
    vector.close()
    return float(reached.mean())


def test_ou_noise_reaches_the_mountain_cars_flag_where_gaussian_noise_does_not():
    """Why td3_mountaincar.yaml explores with OU noise at dt 0.1: noise that keeps pushing
    one way for tens of steps swings the car up; fresh draws every step cancel out."""
    ou = _flag_reached(TD3Config(exploration="ou", exploration_noise=0.5, ou_dt=0.1))
    gaussian = _flag_reached(TD3Config(exploration_noise=0.5))
    slow_ou = _flag_reached(TD3Config(exploration="ou", exploration_noise=0.5, ou_dt=0.01))
    assert ou > 0.5 and gaussian < 0.05 and slow_ou < ou / 2, (ou, gaussian, slow_ou)
