"""Tests for GridWorld (NumPy env, JAX twin, task helpers) and the tasks' tabular state index."""

from __future__ import annotations

import importlib

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlspeed.core.envs
from rlspeed.core.envs.doors import wall_mask
from rlspeed.core.envs.doors_jax import DoorsFunctional, DoorsState
from rlspeed.core.envs.gridworld import GridWorldEnv
from rlspeed.core.envs.gridworld_jax import GridWorldFunctional
from rlspeed.core.envs.vmap import VmapEnv
from rlspeed.core.tasks.doors import DoorsTaskConfig
from rlspeed.core.tasks.gridworld import (
    GridWorldTaskConfig,
    greedy_path,
    shortest_path_length,
)
from rlspeed.registry import TASKS

RIGHT, DOWN, LEFT, UP = range(4)


def biased_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random actions, mostly up or left, so that episodes both reach the goal and time out."""
    return np.where(rng.random(n) < 0.6, rng.choice([UP, LEFT], n), rng.integers(0, 4, n))


# ---------------------------------------------------------------- API checks


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("size", [5, 3])
def test_check_env(size: int) -> None:
    check_env(GridWorldEnv(size=size), skip_render_check=True)
    # Through make() the env has a spec, so check_env also exercises render modes.
    check_env(gymnasium.make("rlspeed/GridWorld-v0", size=size).unwrapped)


def test_registration_spaces_and_render() -> None:
    env = gymnasium.make("rlspeed/GridWorld-v0", render_mode="ansi")
    assert env.spec is not None and env.spec.max_episode_steps == 50
    assert isinstance(env.unwrapped, GridWorldEnv)
    importlib.reload(rlspeed.core.envs)  # must not re-register (or warn)
    fenv = GridWorldFunctional()
    assert (
        env.observation_space
        == fenv.observation_space
        == gymnasium.spaces.Discrete(25, dtype=np.int32)
    )
    assert env.action_space == fenv.action_space == gymnasium.spaces.Discrete(4)
    env.reset()
    assert env.render() == "G....\n.....\n.....\n.....\n....A\n"


def test_dynamics() -> None:
    env = GridWorldEnv(size=3)
    obs, info = env.reset(seed=0)
    assert (obs, info) == (8, {})
    for action in (RIGHT, DOWN):  # off the grid: stay in place
        assert env.step(action) == (8, 0.0, False, False, {})
    assert env.step(LEFT)[0] == 7
    assert env.step(UP)[0] == 4
    assert env.step(UP)[:3] == (1, 0.0, False)
    assert env.step(LEFT) == (0, 1.0, True, False, {})
    with pytest.raises(ValueError):
        env.step(4)


# ---------------------------------------------------------------- NumPy / JAX equivalence


@pytest.mark.parametrize("size", [5, 2])
def test_numpy_jax_equivalence(size: int) -> None:
    fenv = GridWorldFunctional(size=size)

    @jax.jit
    def step(state: jax.Array, action: jax.Array):
        nxt = fenv.transition(state, action)
        return nxt, fenv.observation(nxt), fenv.reward(state, action, nxt), fenv.terminal(nxt)

    env = GridWorldEnv(size=size)
    rng = np.random.default_rng(size)
    terminations = 0
    for _ in range(5):
        obs, _ = env.reset()
        state = fenv.initial(jax.random.key(0))
        assert obs == int(fenv.observation(state))
        for action in biased_actions(rng, 30):
            obs, reward, terminated, _, _ = env.step(action)
            state, j_obs, j_reward, j_terminated = step(state, action)
            assert j_obs.dtype == jnp.int32 and j_obs.shape == ()
            assert (obs, reward, terminated) == (int(j_obs), float(j_reward), bool(j_terminated))
            if terminated:
                terminations += 1
                break
    assert terminations >= 2


def test_vmap_env_matches_numpy() -> None:
    """VmapEnv's auto-reset, truncation and episode statistics against TimeLimit envs."""
    n, size, limit = 6, 4, 9
    venv = VmapEnv(GridWorldFunctional(size=size), n, limit)
    vstep = jax.jit(venv.step)
    state = venv.init(jax.random.key(0))
    envs = [
        gymnasium.make("rlspeed/GridWorld-v0", size=size, max_episode_steps=limit) for _ in range(n)
    ]
    obs = np.array([env.reset()[0] for env in envs])
    np.testing.assert_array_equal(obs, np.asarray(state.obs))
    returns, lengths = np.zeros(n), np.zeros(n, dtype=int)
    rng = np.random.default_rng(0)
    n_term = n_trunc = 0
    for _ in range(60):
        actions = biased_actions(rng, n).astype(np.int32)
        state, result = vstep(state, jnp.asarray(actions))
        for i, env in enumerate(envs):
            final_obs, reward, terminated, truncated, _ = env.step(actions[i])
            returns[i] += reward
            lengths[i] += 1
            assert int(result.final_obs[i]) == final_obs
            assert float(result.reward[i]) == reward
            assert (bool(result.terminated[i]), bool(result.truncated[i])) == (
                terminated,
                truncated,
            )
            next_obs = final_obs
            if terminated or truncated:
                assert float(result.episode_return[i]) == returns[i]
                assert int(result.episode_length[i]) == lengths[i]
                next_obs, _ = env.reset()
                returns[i], lengths[i] = 0.0, 0
                n_term += terminated
                n_trunc += truncated
            assert int(result.obs[i]) == next_obs
    assert n_term >= 5 and n_trunc >= 5


# ---------------------------------------------------------------- greedy helpers


def optimal_policy(obs: np.ndarray) -> np.ndarray:
    """Up along the right column, then left along the top row."""
    return np.where(obs >= 5, UP, LEFT)


def detour_policy(obs: np.ndarray) -> np.ndarray:
    """Reaches the goal the long way: a step left and back right on the way up."""
    detour = {14: LEFT, 13: UP, 8: RIGHT}
    return np.array([detour.get(int(o), int(optimal_policy(o))) for o in obs])


def test_greedy_helpers() -> None:
    cfg = GridWorldTaskConfig()
    evaluate = TASKS.get("gridworld").evaluate
    assert shortest_path_length(cfg) == 8
    assert shortest_path_length(GridWorldTaskConfig(size=7)) == 12

    path = greedy_path(cfg, optimal_policy)
    assert path == [24, 19, 14, 9, 4, 3, 2, 1, 0]
    assert len(path) - 1 == shortest_path_length(cfg)
    assert evaluate(cfg, optimal_policy, 0) == 1.0

    path = greedy_path(cfg, detour_policy)
    assert path == [24, 19, 14, 13, 8, 9, 4, 3, 2, 1, 0]
    assert len(path) - 1 > shortest_path_length(cfg)
    assert evaluate(cfg, detour_policy, 0) == 1.0

    # Always "right" never leaves the start: the whole standard time limit, return 0.
    def always_right(obs: np.ndarray) -> np.ndarray:
        return np.full(len(obs), RIGHT)

    assert greedy_path(cfg, always_right) == [24] * 51
    assert evaluate(cfg, always_right, 0) == 0.0


# ---------------------------------------------------------------- tabular state index


def test_gridworld_state_index_is_the_observation() -> None:
    cfg, tab = GridWorldTaskConfig(size=4), TASKS.get("gridworld").tabular
    assert tab.num_states(cfg) == 16
    obs = np.arange(16, dtype=np.int32)
    for index in (
        tab.state_index(cfg, obs, np),
        jax.jit(lambda o: tab.state_index(cfg, o, jnp))(obs),
    ):
        assert index.dtype == np.int32
        np.testing.assert_array_equal(np.asarray(index), obs)


@pytest.fixture(scope="module")
def doors_index():
    """The Doors state index under NumPy and under jax.jit (cfg is static)."""
    cfg, tab = DoorsTaskConfig(grid_size=9), TASKS.get("doors").tabular
    jitted = jax.jit(lambda obs: tab.state_index(cfg, obs, jnp))

    def both(obs: np.ndarray) -> np.ndarray:
        index = tab.state_index(cfg, obs, np)
        assert index.dtype == np.int32 and jitted(jnp.asarray(obs)).dtype == jnp.int32
        np.testing.assert_array_equal(index, np.asarray(jitted(jnp.asarray(obs))))
        return index

    return cfg, tab, both


def test_doors_state_index_every_agent_cell_and_goal(doors_index) -> None:
    """Exhaustive: each (free agent cell, goal column), agent-on-goal (terminal) included."""
    cfg, tab, index = doors_index
    size = cfg.grid_size
    assert tab.num_states(cfg) == size**3
    free = np.argwhere(~wall_mask(size, cfg.n_doors))
    pairs = np.array([(r, c, g) for r, c in free for g in range(size)], dtype=np.int32)
    states = DoorsState(
        agent=jnp.asarray(pairs[:, :2]),
        goal=jnp.stack([jnp.zeros(len(pairs), jnp.int32), jnp.asarray(pairs[:, 2])], axis=1),
    )
    obs = np.asarray(jax.vmap(DoorsFunctional(grid_size=size).observation)(states))
    on_goal = (pairs[:, 0] == 0) & (pairs[:, 1] == pairs[:, 2])
    assert on_goal.sum() == size and not (obs[on_goal] == 3).any()  # the goal is hidden there

    got = index(obs)
    expected = (pairs[:, 0] * size + pairs[:, 1]) * size + pairs[:, 2]
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) == len(pairs)
    assert got.min() >= 0 and got.max() < tab.num_states(cfg)


def test_doors_state_index_on_random_walks(doors_index) -> None:
    cfg, tab, index = doors_index
    size = cfg.grid_size
    env = gymnasium.make("rlspeed/Doors-v0", grid_size=size, n_doors=cfg.n_doors)
    rng = np.random.default_rng(0)
    seen: dict[int, tuple[int, int]] = {}
    for col in range(size):
        obs, _ = env.reset(options={"start_col": col})
        walk = [obs]
        for action in rng.integers(0, 5, 40):
            obs, _, terminated, truncated, _ = env.step(action)
            walk.append(obs)
            if terminated or truncated:
                break
        walk = np.stack(walk)
        for i, key in enumerate(index(walk).tolist()):
            cell_and_goal = (int(np.flatnonzero(walk[i] == 1)[0]), size - 1 - col)
            assert seen.setdefault(key, cell_and_goal) == cell_and_goal  # unique per pair
            assert 0 <= key < tab.num_states(cfg)
    assert len(seen) > 4 * size
