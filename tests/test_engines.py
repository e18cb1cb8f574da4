"""Every engine steps its copies exactly as single Gymnasium envs would: each copy is run in
lockstep beside a reference ``gym.make`` env, through terminations, truncations and
auto-resets, and every field of every step result is compared."""

from __future__ import annotations

import numpy as np
import pytest

from rlspeed import statefile
from rlspeed.core.envs.doors import AGENT
from rlspeed.registry import ENGINES, TASKS
from rlspeed.seeding import env_seeds

SIZE, MAX_STEPS, NUM_ENVS, STEPS, SEED = 3, 5, 6, 80, 3


def _start_column(obs: np.ndarray) -> int:
    """The agent's column in a start observation (bottom row)."""
    return int(np.flatnonzero(obs.reshape(SIZE, SIZE)[-1] == AGENT)[0])


@pytest.mark.parametrize("engine_name", ["gym-sync", "gym-async", "jax-vmap"])
def test_engine_steps_every_copy_like_a_reference_env(engine_name, make_cfg):
    cfg = make_cfg(
        [f"env={engine_name}", f"num_envs={NUM_ENVS}", f"seed={SEED}"]
        + [f"task.grid_size={SIZE}", f"task.max_steps={MAX_STEPS}"]
    )
    task = TASKS.get("doors")
    engine = ENGINES.get(engine_name).make(task, cfg.task, cfg.env, NUM_ENVS, SEED)
    references = [task.make_env(cfg.task) for _ in range(NUM_ENVS)]
    seeded = engine_name != "jax-vmap"

    def reset(i: int, engine_obs: np.ndarray, seed: int | None = None) -> np.ndarray:
        # Gymnasium engines: copy i draws from its own seed, then continues its stream on
        # auto-reset. jax-vmap draws starts from JAX keys: the reference takes the same one.
        if seeded:
            return references[i].reset(seed=seed)[0]
        return references[i].reset(options={"start_col": _start_column(engine_obs[i])})[0]

    rng = np.random.default_rng(0)
    try:
        obs = np.asarray(engine.reset())
        assert obs.shape == (NUM_ENVS, SIZE * SIZE) and obs.dtype == np.int8
        seeds = env_seeds(SEED, NUM_ENVS)
        expected = np.stack([reset(i, obs, seeds[i]) for i in range(NUM_ENVS)])
        np.testing.assert_array_equal(obs, expected)
        returns, lengths = np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, dtype=int)
        terminations = truncations = 0
        for _ in range(STEPS):
            # Mostly "up": some episodes reach the goal, others run out of time.
            actions = np.where(rng.random(NUM_ENVS) < 0.5, 4, rng.integers(0, 5, NUM_ENVS))
            result = engine.step(actions.astype(np.int32))
            got = {name: np.asarray(value) for name, value in result._asdict().items()}
            for i in range(NUM_ENVS):
                final_obs, reward, terminated, truncated, _ = references[i].step(actions[i])
                returns[i] += reward
                lengths[i] += 1
                assert got["terminated"][i] == terminated and got["truncated"][i] == truncated
                assert got["reward"][i] == pytest.approx(reward, abs=1e-5)
                # The true next observation, the episode's last one where it ended.
                np.testing.assert_array_equal(got["final_obs"][i], final_obs)
                next_obs = final_obs
                if terminated or truncated:
                    assert got["episode_return"][i] == pytest.approx(returns[i], abs=1e-4)
                    assert got["episode_length"][i] == lengths[i] <= MAX_STEPS
                    terminations, truncations = terminations + terminated, truncations + truncated
                    returns[i], lengths[i] = 0.0, 0
                    next_obs = reset(i, got["obs"])
                # Auto-reset: where the episode ended, the next observation is a new start.
                np.testing.assert_array_equal(got["obs"][i], next_obs)
            assert got["terminated"].dtype == got["truncated"].dtype == bool
        # Both ways an episode ends were stepped through, many times.
        assert terminations >= 10 and truncations >= 10, (terminations, truncations)
    finally:
        engine.close()
        for env in references:
            env.close()


@pytest.mark.parametrize(
    ("engine_name", "task_name"),
    [
        ("gym-sync", "cartpole"),
        ("gym-sync", "pendulum"),
        ("gym-sync", "halfcheetah"),
        ("gym-async", "doors"),
        ("gym-async", "cartpole"),
    ],
)
def test_an_engine_restored_from_a_resume_file_steps_on_as_the_original(
    engine_name, task_name, make_cfg, tmp_path
):
    """The envs' state taken mid-episode (in the worker processes on gym-async), through a
    resume file and put back into a new engine: both then step alike, bit for bit, through
    terminations, truncations and auto-resets."""
    cfg = make_cfg([f"env={engine_name}", f"task={task_name}", "task.max_steps=15"])
    task, num_envs, path = TASKS.get(task_name), 3, tmp_path / "state.npz"
    space = task.make_env(cfg.task).action_space
    space.seed(0)
    actions = [np.stack([space.sample() for _ in range(num_envs)]) for _ in range(60)]
    make = ENGINES.get(engine_name).make
    original, restored = (make(task, cfg.task, cfg.env, num_envs, SEED) for _ in range(2))
    try:
        original.reset()
        for step in actions[:20]:
            original.step(step)
        with open(path, "wb") as file:
            statefile.dump(original.state_dict(), file)
        restored.reset()
        restored.load_state_dict(statefile.load(path))
        for step in actions[20:]:
            a, b = original.step(step), restored.step(step)
            for name, x, y in zip(a._fields, a, b, strict=True):
                np.testing.assert_array_equal(x, y, err_msg=name, strict=True)
    finally:
        original.close()
        restored.close()
