"""Tests for the CartPole, Pendulum and HalfCheetah tasks: the JAX twins step for step
against Gymnasium, time limits through VmapEnv, greedy evaluation, and real CLI runs."""

from __future__ import annotations

import logging

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from rlspeed.core.envs.vmap import VmapEnv
from rlspeed.core.tasks import cartpole, halfcheetah, pendulum
from rlspeed.registry import TASKS
from rlspeed.seeding import eval_seeds

# ---------------------------------------------------------------- helpers


def jitted_step(func_env):
    """Batched one-step function of a functional env: next state, obs, reward, terminated."""

    def step(state, action):
        nxt = func_env.transition(state, action)
        return (
            nxt,
            func_env.observation(nxt),
            func_env.reward(state, action, nxt),
            func_env.terminal(nxt),
        )

    return jax.jit(jax.vmap(step))


def assert_twin_matches(env_id, func_env, starts, actions, steps):
    """From the same states, with the same actions, the twin and Gymnasium agree at every step.

    Before each step the Gymnasium env is put in the twin's (float32) state, so the check is
    of the dynamics, not of float32 vs float64 drift over a trajectory.
    """
    step = jitted_step(func_env)
    envs = [gym.make(env_id, max_episode_steps=steps + 1) for _ in starts]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    state = jnp.asarray(starts, dtype=jnp.float32)
    running = np.ones(len(starts), dtype=bool)
    compared = 0
    for t in range(steps):
        next_state, obs, reward, terminated = jax.device_get(step(state, actions[:, t]))
        for i in np.flatnonzero(running):
            env = envs[i]
            env.unwrapped.state = np.asarray(state[i], dtype=np.float64)
            action = actions[i, t] if actions.ndim == 3 else int(actions[i, t])
            gym_obs, gym_reward, gym_terminated, _, _ = env.step(action)
            np.testing.assert_allclose(env.unwrapped.state, next_state[i], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(gym_obs, obs[i], rtol=1e-5, atol=1e-5)
            assert obs[i].dtype == gym_obs.dtype == np.float32
            assert float(reward[i]) == pytest.approx(gym_reward, rel=1e-5, abs=1e-4)
            assert bool(terminated[i]) == gym_terminated, (i, t, state[i])
            running[i] = not gym_terminated
            compared += 1
        state = jnp.asarray(next_state)
    return compared


def run_vmap(func_env, max_steps, actions_fn, steps, num_envs=8, seed=0):
    """Step a jitted VmapEnv; returns the StepResults stacked over time (NumPy)."""
    venv = VmapEnv(func_env, num_envs, max_steps)
    step = jax.jit(venv.step)
    state = jax.jit(venv.init)(jax.random.key(seed))
    results = []
    for t in range(steps):
        state, result = step(state, actions_fn(t))
        results.append(jax.device_get(result))
    return jax.tree.map(lambda *xs: np.stack(xs), *results)


def hand_mean_return(env_id, policy, episodes, seed):
    """Mean return of single-env episodes played one by one, episode i reset with the run
    seed's evaluation seed i."""
    returns, lengths = [], []
    for episode_seed in eval_seeds(seed, episodes):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=episode_seed)
        total, length, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs[None])[0])
            total += float(reward)
            length += 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(length)
    return float(np.mean(returns)), lengths


def balance(obs: np.ndarray) -> np.ndarray:
    """Push the cart toward the side the pole leans (and is falling)."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)


# ---------------------------------------------------------------- JAX twins vs Gymnasium


def test_cartpole_twin_matches_gymnasium_step_by_step():
    rng = np.random.default_rng(0)
    n = 96
    twin = cartpole.make_functional(cartpole.CartPoleTaskConfig())
    starts = np.concatenate(
        [
            # The twin's own start distribution: long episodes.
            np.asarray(jax.vmap(twin.initial)(jax.random.split(jax.random.key(0), n // 3))),
            # Anywhere inside the thresholds, fast.
            rng.uniform([-2.3, -2, -0.2, -2], [2.3, 2, 0.2, 2], (n // 3, 4)),
            # Just inside the thresholds, moving outwards or inwards.
            np.stack(
                [
                    rng.choice([-1, 1], n // 3) * rng.uniform(2.38, 2.3999, n // 3),
                    rng.uniform(-1, 1, n // 3),
                    rng.choice([-1, 1], n // 3) * rng.uniform(0.205, 0.2094, n // 3),
                    rng.uniform(-1, 1, n // 3),
                ],
                axis=1,
            ),
        ]
    )
    actions = rng.integers(0, 2, (n, 60)).astype(np.int32)
    assert assert_twin_matches("CartPole-v1", twin, starts, actions, steps=60) > 1000


def test_pendulum_twin_matches_gymnasium_step_by_step():
    rng = np.random.default_rng(1)
    n = 64
    # Angles far beyond +-pi (the cost normalises them), speeds up to and at the +-8 clip.
    theta = rng.uniform(-20, 20, n)
    speed = np.concatenate([rng.uniform(-8, 8, n - 8), [8, -8, 7.99, -7.99, 7.9, -7.9, 0, 0]])
    # Torques beyond +-2 test the clip.
    actions = rng.uniform(-3, 3, (n, 40, 1)).astype(np.float32)
    twin = pendulum.make_functional(pendulum.PendulumTaskConfig())
    starts = np.stack([theta, speed], axis=1)
    assert assert_twin_matches("Pendulum-v1", twin, starts, actions, steps=40) == n * 40


@pytest.mark.parametrize(
    ("task", "env_id", "bounds"),
    [(cartpole, "CartPole-v1", [0.05] * 4), (pendulum, "Pendulum-v1", [np.pi, 1.0])],
)
def test_twin_spaces_and_start_distribution_are_v1s(task, env_id, bounds):
    twin = task.make_functional(task.SPEC.schema())
    env = gym.make(env_id)
    assert twin.observation_space == env.observation_space
    assert twin.action_space == env.action_space
    starts = np.asarray(jax.vmap(twin.initial)(jax.random.split(jax.random.key(3), 4096)))
    # Uniform over the same box as v1's reset: inside it, and filling it.
    assert np.all(np.abs(starts) <= bounds)
    np.testing.assert_allclose(starts.max(axis=0), bounds, rtol=0.01)
    np.testing.assert_allclose(starts.min(axis=0), -np.asarray(bounds), rtol=0.01)
    obs = np.asarray(jax.vmap(twin.observation)(jnp.asarray(starts)))
    assert all(twin.observation_space.contains(o) for o in obs)


# ---------------------------------------------------------------- time limits through VmapEnv


def test_pendulum_vmap_truncates_every_episode_at_max_steps():
    twin = pendulum.make_functional(pendulum.PendulumTaskConfig())
    torques = jax.random.uniform(jax.random.key(0), (400, 8, 1), minval=-2, maxval=2)
    res = run_vmap(twin, 200, lambda t: torques[t], steps=400)
    done_steps = np.flatnonzero(res.truncated.any(axis=1))
    np.testing.assert_array_equal(done_steps, [199, 399])
    assert res.truncated[[199, 399]].all()
    assert not res.terminated.any()
    np.testing.assert_array_equal(res.episode_length[[199, 399]], 200)
    np.testing.assert_allclose(res.episode_return[199], res.reward[:200].sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(res.episode_return[399], res.reward[200:].sum(axis=0), rtol=1e-5)
    # Gymnasium's TimeLimit: the same env truncates on the same step.
    env = pendulum.make_env(pendulum.PendulumTaskConfig())
    env.reset(seed=0)
    truncated = [env.step(np.zeros(1, np.float32))[3] for _ in range(200)]
    assert truncated == [False] * 199 + [True]


def test_cartpole_vmap_constant_push_terminates_early_with_return_equal_length():
    twin = cartpole.make_functional(cartpole.CartPoleTaskConfig())
    push = jnp.ones(8, dtype=jnp.int32)
    res = run_vmap(twin, 500, lambda t: push, steps=40)
    for i in range(8):
        first = np.flatnonzero(res.terminated[:, i] | res.truncated[:, i])[0]
        assert res.terminated[first, i] and not res.truncated[first, i]
        length = res.episode_length[first, i]
        assert length == first + 1 < 20
        assert res.episode_return[first, i] == length
        # The cart was pushed right until the pole fell left.
        assert res.final_obs[first, i, 2] < -CartPoleEnv().theta_threshold_radians
    # The same push ends Gymnasium's episodes after as few steps.
    gym_lengths = hand_mean_return("CartPole-v1", lambda o: np.ones(1, np.int64), 8, 0)[1]
    assert max(gym_lengths) < 20


def test_cartpole_vmap_truncates_at_a_short_limit_like_timelimit():
    twin = cartpole.make_functional(cartpole.CartPoleTaskConfig())
    res = run_vmap(twin, 3, lambda t: jnp.full(8, t % 2, dtype=jnp.int32), steps=9)
    np.testing.assert_array_equal(res.truncated.all(axis=1), [0, 0, 1] * 3)
    assert not res.truncated[[0, 1, 3, 4, 6, 7]].any()
    np.testing.assert_array_equal(res.episode_length[2::3], 3)
    np.testing.assert_array_equal(res.episode_return[2::3], 3.0)
    env = cartpole.make_env(cartpole.CartPoleTaskConfig(max_steps=3))
    env.reset(seed=0)
    assert [env.step(t % 2)[3] for t in range(3)] == [False, False, True]


# ---------------------------------------------------------------- greedy evaluation


@pytest.mark.parametrize(
    ("task", "env_id", "action"),
    [
        (cartpole, "CartPole-v1", np.int64(0)),
        (pendulum, "Pendulum-v1", np.array([0.7], np.float32)),
    ],
)
def test_evaluate_equals_the_mean_of_plain_episodes(task, env_id, action):
    calls = []

    def constant(obs):
        calls.append(obs.shape)
        return np.repeat(action[None], len(obs), axis=0)

    # Training length does not matter: the score uses the standard length.
    cfg = task.SPEC.schema(max_steps=5, eval_episodes=6)
    score = task.evaluate(cfg, constant, 7)
    expected, lengths = hand_mean_return(env_id, lambda obs: np.repeat(action[None], 1, 0), 6, 7)
    assert score == pytest.approx(expected, rel=1e-12)
    # One batched call per step, in lockstep, until the longest episode ends.
    obs_shape = task.make_env(cfg).observation_space.shape
    assert calls == [(6, *obs_shape)] * max(lengths)


def test_cartpole_evaluate_tells_a_balancing_controller_from_a_random_policy():
    cfg = cartpole.CartPoleTaskConfig(max_steps=20)
    rng = np.random.default_rng(0)
    random_score = cartpole.evaluate(cfg, lambda obs: rng.integers(0, 2, len(obs)), 0)
    balance_score = cartpole.evaluate(cfg, balance, 0)
    assert random_score < 50
    assert balance_score == 500.0


# ---------------------------------------------------------------- HalfCheetah


def test_halfcheetah_env_builds_steps_and_truncates_at_max_steps(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    # In a full test run an earlier in-process run chose EGL (rlspeed.train: MUJOCO_GL) before
    # mujoco was first imported; PyOpenGL then logs its missing accelerator on import, into a
    # handler an earlier test's capture closed. That is the test process's state, not MuJoCo's.
    # Logging is off while it builds: what reaches stderr then comes past logging.
    logging.disable(logging.CRITICAL)
    try:
        env = halfcheetah.make_env(halfcheetah.HalfCheetahTaskConfig(max_steps=5))
    finally:
        logging.disable(logging.NOTSET)
    # MuJoCo's warnings go to logging, not to stderr and a log file in the working directory.
    assert capfd.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []
    assert isinstance(env.action_space, gym.spaces.Box)
    assert env.action_space.shape == (6,)
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    flags = []
    for _ in range(5):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert np.isfinite(reward) and obs.shape == env.observation_space.shape
        flags.append((terminated, truncated))
    assert flags == [(False, False)] * 4 + [(False, True)]
    assert halfcheetah.SPEC.action_kind == "continuous"


def test_halfcheetah_twin_spaces_starts_and_observations_are_v5s():
    twin = halfcheetah.make_functional(halfcheetah.HalfCheetahTaskConfig())
    v5 = halfcheetah.make_env(halfcheetah.HalfCheetahTaskConfig()).unwrapped
    assert twin.action_space == v5.action_space
    assert twin.observation_space.shape == v5.observation_space.shape == (17,)
    starts = jax.jit(jax.vmap(twin.initial))(jax.random.split(jax.random.key(3), 4096))
    qpos, qvel = np.asarray(starts.qpos), np.asarray(starts.qvel)
    # v5's reset noise: qpos0 + U(-0.1, 0.1) on all 9 coordinates (x included), qvel 0.1 N(0, 1).
    offset = qpos - v5.init_qpos
    assert np.all(np.abs(offset) <= 0.1)
    np.testing.assert_allclose(offset.max(axis=0), 0.1, rtol=0.01)
    np.testing.assert_allclose(offset.min(axis=0), -0.1, rtol=0.01)
    np.testing.assert_allclose(qvel.mean(axis=0), 0, atol=0.01)
    np.testing.assert_allclose(qvel.std(axis=0), 0.1, rtol=0.05)
    # The twin observes a state as v5 does (x left out): set v5 to it and compare.
    obs = np.asarray(jax.vmap(twin.observation)(starts))
    for i in range(4):
        v5.set_state(qpos[i].astype(np.float64), qvel[i].astype(np.float64))
        np.testing.assert_allclose(obs[i], v5._get_obs(), rtol=1e-6)
    assert obs.dtype == np.float32 and twin.observation_space.contains(obs[0])
    assert not np.asarray(jax.vmap(twin.terminal)(starts)).any()


def halfcheetah_gaps(steps, resync, num_envs=8, seed=0):
    """Largest |twin - v5| of the observations and of the rewards at each of ``steps`` steps
    from ``num_envs`` of the twin's start states, along the same uniform random actions.
    ``resync``: v5 is put in the twin's state (qpos, qvel, solver warm start) before each
    step, so only one step's error is measured, not its growth along a trajectory."""
    twin = halfcheetah.make_functional(halfcheetah.HalfCheetahTaskConfig())
    step = jitted_step(twin)
    state = jax.vmap(twin.initial)(jax.random.split(jax.random.key(seed), num_envs))
    actions = np.random.default_rng(seed).uniform(-1, 1, (steps, num_envs, 6)).astype(np.float32)
    envs = [halfcheetah.make_env(halfcheetah.HalfCheetahTaskConfig()) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    gaps = np.zeros((steps, 2))
    for t in range(steps):
        if resync or t == 0:
            for i, env in enumerate(envs):
                qpos, qvel, warm = (np.asarray(x[i], np.float64) for x in state)
                env.unwrapped.set_state(qpos, qvel)
                env.unwrapped.data.qacc_warmstart[:] = warm
        state, obs, reward, terminated = jax.device_get(step(state, jnp.asarray(actions[t])))
        assert not terminated.any()
        v5 = [env.step(actions[t, i])[:2] for i, env in enumerate(envs)]
        gaps[t] = (
            np.abs(obs - np.stack([o for o, _ in v5])).max(),
            np.abs(reward - np.array([r for _, r in v5])).max(),
        )
    return gaps


@pytest.mark.slow
def test_halfcheetah_twin_steps_like_v5():
    """Measured over seeds 0-2 with 16 envs each: one step's gap at most 3.2e-3 on the
    observations (velocities reach ~10) and 3.3e-5 on the rewards; along a trajectory at most
    6.3e-3 and 2.3e-3 after 10 steps, then contacts amplify float32 rounding and the two part
    (0.7-5 apart after 30 steps), as a float64 v5 started 1e-6 away also does."""
    one_step = halfcheetah_gaps(100, resync=True)
    assert one_step[:, 0].max() < 1e-2 and one_step[:, 1].max() < 1e-4, one_step.max(axis=0)
    along = halfcheetah_gaps(10, resync=False)
    assert along[:, 0].max() < 2e-2 and along[:, 1].max() < 1e-2, along.max(axis=0)


def test_halfcheetah_evaluate_runs_standard_length_episodes():
    lengths = []

    def still(obs):
        lengths.append(len(obs))
        return np.zeros((len(obs), 6), np.float32)

    cfg = halfcheetah.HalfCheetahTaskConfig(max_steps=5, eval_episodes=2)
    assert np.isfinite(halfcheetah.evaluate(cfg, still, 0))
    assert lengths == [2] * 1000


# ---------------------------------------------------------------- config and CLI


@pytest.mark.parametrize(
    ("name", "max_steps", "kind"),
    [
        ("cartpole", 500, "discrete"),
        ("pendulum", 200, "continuous"),
        ("halfcheetah", 1000, "continuous"),
    ],
)
def test_task_configs_compose(make_cfg, name, max_steps, kind):
    cfg = make_cfg([f"task={name}"])
    assert cfg.task.name == name
    assert cfg.task.max_steps == max_steps
    assert cfg.task.eval_episodes == 10
    assert make_cfg([f"task={name}", "task.max_steps=50"]).task.max_steps == 50
    assert TASKS.get(name).action_kind == kind
