"""Tests for the Doors gridworld (NumPy env and JAX functional twin)."""

from __future__ import annotations

import importlib
import math
from collections import deque

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlspeed.core.envs  # noqa: F401  (registers rlspeed/Doors-v0)
from rlspeed.core.envs.doors import DoorsEnv, doors_columns
from rlspeed.core.envs.doors_jax import DoorsFunctional, DoorsState

SIZE = 15
MAX_STEPS = 32
STAY, RIGHT, DOWN, LEFT, UP = range(5)


# ---------------------------------------------------------------- helpers


def shortest_path(col: int, size: int = SIZE, doors: tuple[int, ...] = (4, 9, 14)) -> list[int]:
    """Bottom row to the door column, up through the door, then along the top row."""
    goal = size - 1 - col
    # Ties go to the door nearest the start ("nearest useful door").
    door = min(doors, key=lambda d: (abs(col - d) + abs(d - goal), abs(col - d)))

    def horizontal(src: int, dst: int) -> list[int]:
        return [RIGHT if dst > src else LEFT] * abs(dst - src)

    return horizontal(col, door) + [UP] * (size - 1) + horizontal(door, goal)


def bfs_length(obs: np.ndarray, size: int = SIZE) -> int:
    """Shortest number of moves from agent to goal in an observation grid."""
    grid = obs.reshape(size, size)
    start = tuple(int(v) for v in np.argwhere(grid == 1)[0])
    goal = tuple(int(v) for v in np.argwhere(grid == 3)[0])
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return dist[(r, c)]
        for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and grid[nxt] != 2 and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    raise AssertionError("goal unreachable")


@pytest.fixture(scope="module")
def jfn():
    """The functional env plus jitted step / observation / start functions (traced once)."""
    fenv = DoorsFunctional()

    def step(state: DoorsState, action: jax.Array):
        nxt = fenv.transition(state, action)
        return nxt, fenv.observation(nxt), fenv.reward(state, action, nxt), fenv.terminal(nxt)

    def start(col: jax.Array):
        state = fenv.state_from_start_column(col)
        return state, fenv.observation(state)

    def restart_where(states: DoorsState, done: jax.Array, cols: jax.Array) -> DoorsState:
        fresh = jax.vmap(fenv.state_from_start_column)(cols)
        return jax.tree.map(lambda f, s: jnp.where(done[:, None], f, s), fresh, states)

    return {
        "env": fenv,
        "step": jax.jit(step),
        "start": jax.jit(start),
        "vstep": jax.jit(jax.vmap(step)),
        "vstart": jax.jit(jax.vmap(start)),
        "vobs": jax.jit(jax.vmap(fenv.observation)),
        "restart_where": jax.jit(restart_where),
        "initial": jax.jit(jax.vmap(fenv.initial)),
    }


# ---------------------------------------------------------------- API checks


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("grid_size", [15, 9])
def test_check_env(grid_size: int) -> None:
    check_env(DoorsEnv(grid_size=grid_size, n_doors=3), skip_render_check=True)
    # Through make() the env has a spec, so check_env also exercises render modes.
    env = gymnasium.make("rlspeed/Doors-v0", grid_size=grid_size, n_doors=3)
    check_env(env.unwrapped)


def test_registration() -> None:
    env = gymnasium.make("rlspeed/Doors-v0")
    assert env.spec is not None and env.spec.max_episode_steps == MAX_STEPS
    assert isinstance(env.unwrapped, DoorsEnv)
    importlib.reload(rlspeed.core.envs)  # must not re-register (or warn)
    assert "rlspeed/Doors-v0" in gymnasium.registry


def test_spaces_match() -> None:
    env, fenv = DoorsEnv(), DoorsFunctional()
    assert env.observation_space == fenv.observation_space
    assert env.action_space == fenv.action_space == gymnasium.spaces.Discrete(5)
    assert env.observation_space.dtype == np.int8
    assert env.observation_space.shape == (SIZE * SIZE,)


def test_render_ansi() -> None:
    env = DoorsEnv(render_mode="ansi")
    env.reset(options={"start_col": 2})
    lines = env.render().splitlines()
    assert len(lines) == SIZE
    assert lines[0][SIZE - 1 - 2] == "G" and lines[-1][2] == "A"
    assert lines[SIZE // 2] == "####.####.####."


# ---------------------------------------------------------------- layout


def test_door_columns() -> None:
    assert doors_columns(15, 3) == [4, 9, 14]
    assert doors_columns(9, 3) == [2, 5, 8]


@pytest.mark.parametrize("col", range(SIZE))
def test_reset_layout(col: int) -> None:
    env = DoorsEnv()
    obs, info = env.reset(seed=0, options={"start_col": col})
    assert info == {}
    assert obs.dtype == np.int8 and obs.shape == (SIZE * SIZE,)
    assert env.observation_space.contains(obs)
    grid = obs.reshape(SIZE, SIZE)
    assert np.argwhere(grid == 1).tolist() == [[SIZE - 1, col]]
    assert np.argwhere(grid == 3).tolist() == [[0, SIZE - 1 - col]]
    expected_wall = [[SIZE // 2, c] for c in range(SIZE) if c not in (4, 9, 14)]
    assert np.argwhere(grid == 2).tolist() == expected_wall
    assert np.count_nonzero(grid) == 2 + len(expected_wall)


def test_random_reset_is_seeded_and_valid(jfn) -> None:
    env = DoorsEnv()
    cols = set()
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        grid = obs.reshape(SIZE, SIZE)
        (row, col), (grow, gcol) = np.argwhere(grid == 1)[0], np.argwhere(grid == 3)[0]
        assert row == SIZE - 1 and grow == 0 and gcol == SIZE - 1 - col
        np.testing.assert_array_equal(obs, env.reset(seed=seed)[0])
        cols.add(int(col))
    assert len(cols) > 5

    # One key per env, and the batched draw VmapEnv resets with (one key for all envs).
    batched = DoorsFunctional().initial_batch(jax.random.key(0), 1500)
    for states in (jfn["initial"](jax.random.split(jax.random.key(0), 64)), batched):
        agent, goal = np.asarray(states.agent), np.asarray(states.goal)
        assert (agent[:, 0] == SIZE - 1).all() and (goal[:, 0] == 0).all()
        assert ((agent[:, 1] >= 0) & (agent[:, 1] < SIZE)).all()
        np.testing.assert_array_equal(goal[:, 1], SIZE - 1 - agent[:, 1])
        assert len(np.unique(agent[:, 1])) > 5
    counts = np.bincount(np.asarray(batched.agent[:, 1]), minlength=SIZE)
    assert counts.min() > 60 and counts.max() < 140, counts  # uniform: 100 each


# ---------------------------------------------------------------- NumPy / JAX equivalence


def action_sequences(col: int) -> list[list[int]]:
    """Uniform random sequences plus one scripted to reach the goal twice."""
    seqs = [
        np.random.default_rng(1000 * seed + col).integers(0, 5, 80).tolist() for seed in range(3)
    ]
    rng = np.random.default_rng(col)
    path = shortest_path(col)
    # Both paths start an episode: the first one ends it with terminated=True.
    seqs.append(path + path + rng.integers(0, 5, 45).tolist())
    return seqs


def test_numpy_jax_equivalence(jfn) -> None:
    env = gymnasium.make("rlspeed/Doors-v0")
    counts = {"terminated": 0, "truncated": 0}
    for col in range(SIZE):
        for actions in action_sequences(col):
            obs, _ = env.reset(options={"start_col": col})
            state, j_obs = jfn["start"](col)
            np.testing.assert_array_equal(obs, np.asarray(j_obs))
            steps = 0
            for action in actions:
                obs, reward, terminated, truncated, _ = env.step(action)
                state, j_obs, j_reward, j_terminated = jfn["step"](state, action)
                steps += 1
                np.testing.assert_array_equal(obs, np.asarray(j_obs))
                assert obs.dtype == np.asarray(j_obs).dtype == np.int8
                assert reward == pytest.approx(float(j_reward), abs=1e-5)
                assert terminated == bool(j_terminated)
                assert truncated == (steps >= MAX_STEPS)
                if terminated or truncated:
                    counts["terminated"] += terminated
                    counts["truncated"] += truncated
                    # Start a new episode and keep stepping both sides.
                    obs, _ = env.reset(options={"start_col": col})
                    state, j_obs = jfn["start"](col)
                    np.testing.assert_array_equal(obs, np.asarray(j_obs))
                    steps = 0
    assert counts["terminated"] >= 2 * SIZE and counts["truncated"] > SIZE


def test_numpy_jax_equivalence_vmap(jfn) -> None:
    cols = np.arange(SIZE)
    envs = [gymnasium.make("rlspeed/Doors-v0") for _ in cols]
    obs = np.stack(
        [e.reset(options={"start_col": int(c)})[0] for e, c in zip(envs, cols, strict=True)]
    )
    states, j_obs = jfn["vstart"](jnp.asarray(cols))
    np.testing.assert_array_equal(obs, np.asarray(j_obs))

    rng = np.random.default_rng(7)
    paths = [shortest_path(int(c)) for c in cols]
    episode = np.zeros(SIZE, dtype=int)
    steps = np.zeros(SIZE, dtype=int)
    n_term = n_trunc = 0
    for _ in range(150):
        # Even episodes follow the shortest path (so terminations happen), odd ones are random.
        actions = np.array(
            [
                paths[i][steps[i]]
                if episode[i] % 2 == 0 and steps[i] < len(paths[i])
                else rng.integers(5)
                for i in range(SIZE)
            ],
            dtype=np.int32,
        )
        results = [e.step(int(a)) for e, a in zip(envs, actions, strict=True)]
        states, j_obs, j_reward, j_terminated = jfn["vstep"](states, jnp.asarray(actions))
        steps += 1
        np.testing.assert_array_equal(np.stack([r[0] for r in results]), np.asarray(j_obs))
        np.testing.assert_allclose([r[1] for r in results], np.asarray(j_reward), atol=1e-5, rtol=0)
        terminated = np.array([r[2] for r in results])
        truncated = np.array([r[3] for r in results])
        np.testing.assert_array_equal(terminated, np.asarray(j_terminated))
        np.testing.assert_array_equal(truncated, steps >= MAX_STEPS)

        done = terminated | truncated
        n_term += int(terminated.sum())
        n_trunc += int(truncated.sum())
        if done.any():
            for i in np.flatnonzero(done):
                envs[i].reset(options={"start_col": int(cols[i])})
            states = jfn["restart_where"](states, jnp.asarray(done), jnp.asarray(cols))
            episode[done] += 1
            steps[done] = 0
            obs = np.stack([e.unwrapped._obs() for e in envs])
            np.testing.assert_array_equal(obs, np.asarray(jfn["vobs"](states)))
    assert n_term >= SIZE and n_trunc >= SIZE


# ---------------------------------------------------------------- behaviour


def test_shortest_path_from_column_zero() -> None:
    env = DoorsEnv()
    env.reset(options={"start_col": 0})
    path = shortest_path(0)
    assert path == [RIGHT] * 4 + [UP] * 14 + [RIGHT] * 10
    total = 0.0
    for i, action in enumerate(path):
        obs, reward, terminated, truncated, _ = env.step(action)
        total += reward
        assert not truncated
        assert terminated == (i == len(path) - 1)
    grid = obs.reshape(SIZE, SIZE)
    assert grid[0, SIZE - 1] == 1 and not (grid == 3).any()  # agent drawn over goal
    assert total == pytest.approx(math.hypot(SIZE - 1, SIZE - 1), abs=1e-4)


def test_blocked_moves_stay_in_place() -> None:
    env = DoorsEnv()
    start, _ = env.reset(options={"start_col": 0})
    for action in (DOWN, LEFT, STAY):  # off the grid, off the grid, no move
        obs, reward, terminated, _, _ = env.step(action)
        np.testing.assert_array_equal(obs, start)
        assert reward == 0.0 and not terminated
    for _ in range(SIZE - 2 - SIZE // 2):  # up to the row just below the wall
        before, _, _, _, _ = env.step(UP)
    assert before.reshape(SIZE, SIZE)[SIZE // 2 + 1, 0] == 1
    obs, reward, terminated, _, _ = env.step(UP)  # bump into the wall
    np.testing.assert_array_equal(obs, before)
    assert reward == 0.0 and not terminated


def test_best_achievable_ratio() -> None:
    env = DoorsEnv()
    total_dist = total_len = 0.0
    for col in range(SIZE):
        obs, _ = env.reset(options={"start_col": col})
        path = shortest_path(col)
        assert len(path) == bfs_length(obs)  # the scripted path is optimal
        total_dist += math.hypot(SIZE - 1, (SIZE - 1 - col) - col)
        terminated = False
        for action in path:
            assert not terminated
            _, _, terminated, _, _ = env.step(action)
        assert terminated
        total_len += len(path)
    assert round(total_dist / total_len, 3) == round(0.7424, 3)
    assert total_dist / total_len == pytest.approx(0.7424, abs=5e-5)
