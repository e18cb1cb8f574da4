"""Ring buffers of transitions: NumPy for the host-driven training loops, and the same
buffer as pure functions of JAX arrays for the fused ``lax.scan`` loops (which import JAX
only when called, so torch runs never load it)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class Batch(NamedTuple):
    obs: np.ndarray
    next_obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray  # 1.0 where the episode terminated (not merely truncated)


class ReplayBuffer:
    def __init__(
        self, capacity: int, obs_space: Any, action_space: Any, rng: np.random.Generator
    ) -> None:
        self.capacity = capacity
        self.obs = np.zeros((capacity, *obs_space.shape), dtype=obs_space.dtype)
        self.next_obs = np.zeros_like(self.obs)
        self.actions = np.zeros((capacity, *action_space.shape), dtype=action_space.dtype)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self._pos = 0
        self._rng = rng

    def add(self, obs: Any, next_obs: Any, actions: Any, rewards: Any, terminated: Any) -> None:
        """Store a batch of transitions, one per env (arrays of any CPU library)."""
        n = len(rewards)
        index = (self._pos + np.arange(n)) % self.capacity
        self.obs[index] = np.asarray(obs)
        self.next_obs[index] = np.asarray(next_obs)
        self.actions[index] = np.asarray(actions)
        self.rewards[index] = np.asarray(rewards)
        self.dones[index] = np.asarray(terminated)
        self._pos = (self._pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> Batch:
        index = self._rng.integers(0, self.size, size=batch_size)
        return Batch(
            self.obs[index],
            self.next_obs[index],
            self.actions[index],
            self.rewards[index],
            self.dones[index],
        )


class JaxReplay(NamedTuple):
    """The ring buffer as a pytree of JAX arrays (carried through ``lax.scan``)."""

    obs: Any
    next_obs: Any
    actions: Any
    rewards: Any
    dones: Any
    position: Any
    size: Any


def jax_replay_init(capacity: int, obs_space: Any, action_space: Any) -> JaxReplay:
    import jax
    import jax.numpy as jnp

    # JAX's own width of each dtype (float64 -> float32 unless x64 is enabled).
    obs_dtype, action_dtype = (
        jax.dtypes.canonicalize_dtype(space.dtype) for space in (obs_space, action_space)
    )
    obs = jnp.zeros((capacity, *obs_space.shape), obs_dtype)
    return JaxReplay(
        obs=obs,
        next_obs=obs,
        actions=jnp.zeros((capacity, *action_space.shape), action_dtype),
        rewards=jnp.zeros(capacity, jnp.float32),
        dones=jnp.zeros(capacity, jnp.float32),
        position=jnp.int32(0),
        size=jnp.int32(0),
    )


def jax_replay_add(
    replay: JaxReplay, obs: Any, next_obs: Any, actions: Any, rewards: Any, terminated: Any
) -> JaxReplay:
    """Store one transition per env (pure: returns the new buffer)."""
    import jax.numpy as jnp

    n, capacity = rewards.shape[0], replay.rewards.shape[0]
    index = (replay.position + jnp.arange(n)) % capacity
    return JaxReplay(
        replay.obs.at[index].set(obs),
        replay.next_obs.at[index].set(next_obs),
        replay.actions.at[index].set(actions.astype(replay.actions.dtype)),
        replay.rewards.at[index].set(rewards),
        replay.dones.at[index].set(terminated.astype(jnp.float32)),
        (replay.position + n) % capacity,
        jnp.minimum(replay.size + n, capacity),
    )


def jax_replay_sample(replay: JaxReplay, key: Any, batch_size: int) -> Batch:
    """A uniform batch (with replacement) of the stored transitions."""
    import jax

    index = jax.random.randint(key, (batch_size,), 0, replay.size)
    return Batch(
        replay.obs[index],
        replay.next_obs[index],
        replay.actions[index],
        replay.rewards[index],
        replay.dones[index],
    )
