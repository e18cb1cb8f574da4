"""A NumPy ring buffer of transitions for the host-driven (non-fused) training loops."""

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
    def __init__(self, capacity: int, obs_space: Any, action_space: Any, seed: int) -> None:
        self.capacity = capacity
        self.obs = np.zeros((capacity, *obs_space.shape), dtype=obs_space.dtype)
        self.next_obs = np.zeros_like(self.obs)
        self.actions = np.zeros((capacity, *action_space.shape), dtype=action_space.dtype)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self._pos = 0
        self._rng = np.random.default_rng(seed)

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
