"""The replay buffers store each observation once and still give every transition its own
next observation: the one after it, or the final one of a truncated episode."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlspeed.core.algos.replay import ReplayBuffer, final_capacity
from rlspeed.core.algos.replay_jax import jax_replay_add, jax_replay_init, jax_replay_sample

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACTIONS = gym.spaces.Discrete(3)


def _episodes(num_envs: int, max_steps: int, steps: int, seed: int = 0):
    """Steps of ``num_envs`` envs with random observations, terminations and time limits:
    (obs, observation the step ended in, actions, rewards, terminated, truncated)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(num_envs, 2)).astype(np.float32)
    length = np.zeros(num_envs, int)
    for _ in range(steps):
        ended_in = rng.normal(size=(num_envs, 2)).astype(np.float32)
        length += 1
        terminated = rng.random(num_envs) < 0.1
        truncated = length >= max_steps
        yield (
            obs,
            ended_in,
            rng.integers(0, 3, num_envs),
            rng.normal(size=num_envs).astype(np.float32),
            terminated,
            truncated,
        )
        done = terminated | truncated
        reset = rng.normal(size=(num_envs, 2)).astype(np.float32)
        obs = np.where(done[:, None], reset, ended_in)
        length[done] = 0


@pytest.mark.parametrize(
    ("num_envs", "capacity", "max_steps"),
    [(3, 20, 4), (4, 16, 1), (1, 7, 3)],
    ids=["3-envs", "every-step-truncated", "one-env"],
)
def test_every_transition_keeps_its_next_observation(num_envs, capacity, max_steps):
    """Step by step, every transition in the buffer (host and JAX alike) has the next
    observation it was stored with; terminated ones need none."""
    host = ReplayBuffer(capacity, OBS, ACTIONS, np.random.default_rng(1), num_envs, max_steps)
    device = jax_replay_init(capacity, OBS, ACTIONS, num_envs, max_steps)
    add = jax.jit(jax_replay_add)
    stored = []  # every transition added, oldest first
    for obs, ended_in, actions, rewards, terminated, truncated in _episodes(
        num_envs, max_steps, 120
    ):
        host.add(obs, ended_in, actions, rewards, terminated, truncated)
        device = add(device, *(jnp.asarray(x) for x in (obs, ended_in, actions, rewards)),
                     jnp.asarray(terminated), jnp.asarray(truncated))  # fmt: skip
        stored += [
            (obs[e], ended_in[e], actions[e], rewards[e], terminated[e]) for e in range(num_envs)
        ]
        kept = stored[-capacity:]
        assert host.size == int(device.size) == len(kept)
        # The draws [0, size) are the kept transitions, oldest first.
        host._rng = np.random.default_rng(0)
        draws = np.random.default_rng(0).integers(0, host.size, size=64)
        batch = host.sample(64)
        for i, draw in enumerate(draws):
            obs_i, next_i, action_i, reward_i, terminated_i = kept[draw]
            np.testing.assert_array_equal(batch.obs[i], obs_i)
            assert batch.actions[i] == action_i and batch.rewards[i] == reward_i
            assert batch.dones[i] == terminated_i
            if not terminated_i:
                np.testing.assert_array_equal(batch.next_obs[i], next_i)
    key = jax.random.key(3)
    device_batch = jax_replay_sample(device, key, 64, num_envs)
    host_draws = np.asarray(jax.random.randint(key, (64,), 0, device.size))
    for i, draw in enumerate(host_draws):
        obs_i, next_i, _, _, terminated_i = kept[draw]
        np.testing.assert_array_equal(np.asarray(device_batch.obs[i]), obs_i)
        if not terminated_i:
            np.testing.assert_array_equal(np.asarray(device_batch.next_obs[i]), next_i)


def test_each_observation_is_stored_once():
    """Doors' standard buffer: 50,000 transitions of 4 envs, episodes of at most 32 steps.
    The observations take one row per transition, one spare row per env and the final
    observations of at most one truncated episode in 32 steps: 3.2% on top, where storing
    each transition's two observations took 100%."""
    capacity, num_envs, max_steps = 50_000, 4, 32
    host = ReplayBuffer(capacity, OBS, ACTIONS, np.random.default_rng(0), num_envs, max_steps)
    observations = [
        x for x in vars(host).values() if isinstance(x, np.ndarray) and x.shape[1:] == OBS.shape
    ]
    rows = sum(len(x) for x in observations)
    assert final_capacity(capacity, num_envs, max_steps) == 1_568
    assert rows == capacity + num_envs + 1_568 < 1.04 * capacity


@pytest.mark.parametrize("steps", [3, 30], ids=["filling", "wrapped"])
def test_a_resume_state_holds_what_the_buffer_holds(tmp_path, steps):
    """A buffer's resume state is its written part, not its capacity, float observations as
    float32 (what the networks read), and a buffer restored from the file draws the same
    batches and holds the same arrays as the one it was saved from."""
    from rlspeed.checkpoint import save_resume
    from rlspeed.core.state import capture, restore
    from rlspeed.statefile import load

    wide = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)  # as MuJoCo's observations are

    def buffer(seed: int) -> ReplayBuffer:
        return ReplayBuffer(80, wide, ACTIONS, np.random.default_rng(seed), 3, 4)

    saved = buffer(1)
    for step in _episodes(3, 4, steps):
        saved.add(*step)
    assert saved.obs.dtype == saved.final_obs.dtype == np.float32
    state = capture(saved)
    written = 3 * steps + 3 if steps == 3 else 83  # the next step's slots, or all of them
    assert len(state["obs"]) == len(state["dones"]) == written
    save_resume({"buffer": state}, tmp_path / "resume.npz")
    restored = buffer(2)
    restore(restored, load(tmp_path / "resume.npz")["buffer"])
    for name in (*ReplayBuffer.SLOT_ARRAYS, "final_obs"):
        np.testing.assert_array_equal(getattr(restored, name), getattr(saved, name), name)
    for a, b in zip(restored.sample(16), saved.sample(16), strict=True):
        np.testing.assert_array_equal(a, b)
