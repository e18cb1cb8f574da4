"""The three engines give the same step results: auto-reset, final observations, statistics."""

from __future__ import annotations

import numpy as np
import pytest

from rlspeed.registry import ENGINES, TASKS


@pytest.mark.parametrize("engine_name", ["gym-sync", "gym-async", "jax-vmap"])
def test_engine_step_results_are_consistent(engine_name, make_cfg):
    cfg = make_cfg([f"env={engine_name}", "num_envs=4", "task.max_steps=10"])
    task, spec = TASKS.get("doors"), ENGINES.get(engine_name)
    engine = spec.make(task, cfg.task, cfg.env, cfg.num_envs, cfg.seed)
    rng = np.random.default_rng(0)
    try:
        obs = np.asarray(engine.reset())
        assert obs.shape == (4, 225) and obs.dtype == np.int8
        returns, lengths, finished = np.zeros(4), np.zeros(4, dtype=int), 0
        for _ in range(60):
            # Mostly "up" so that some episodes reach the goal column's row and most truncate.
            actions = np.where(rng.random(4) < 0.7, 4, rng.integers(0, 5, 4)).astype(np.int32)
            result = engine.step(actions)
            reward = np.asarray(result.reward)
            done = np.asarray(result.terminated) | np.asarray(result.truncated)
            returns += reward
            lengths += 1
            final_obs, next_obs = np.asarray(result.final_obs), np.asarray(result.obs)
            # The stored transition continues from the observation the action was taken in.
            assert ((final_obs == 1).sum(axis=1) == 1).all()
            for i in np.flatnonzero(done):
                episode_return = np.asarray(result.episode_return)[i]
                np.testing.assert_allclose(episode_return, returns[i], atol=1e-4)
                assert np.asarray(result.episode_length)[i] == lengths[i] <= 10
                # Auto-reset: the next observation is a fresh start in the bottom row.
                assert (next_obs[i].reshape(15, 15)[14] == 1).any()
                returns[i], lengths[i] = 0.0, 0
                finished += 1
            not_done = ~done
            np.testing.assert_array_equal(final_obs[not_done], next_obs[not_done])
            obs = next_obs
        assert finished >= 20
        assert np.asarray(result.truncated).dtype == bool
    finally:
        engine.close()
