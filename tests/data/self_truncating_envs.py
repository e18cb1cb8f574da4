"""A Gymnasium env that truncates its own episodes, for ``task=gym`` runs of the replay
tests (``task.import=self_truncating_envs``, with this folder on the path).

Each observation is (episode number, step in the episode), unique across every env of the
process, so a transition's true next observation is its own plus one step: any other
(another episode's final observation, a reset observation) is told apart at a glance.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# Episode numbers, shared by every env of the process (gym-sync runs them all in one).
_EPISODES = itertools.count()


class SelfTruncating(gym.Env):
    """Episodes of ``lengths[0]``, ``lengths[1]``, ... steps (cycled), each truncated by
    the env itself, long before the registered time limit."""

    def __init__(self, lengths: Sequence[int] = (1,)) -> None:
        # A tuple and an index, not an itertools.cycle: state a resume file holds.
        self.lengths, self.episodes_begun = tuple(lengths), 0
        self.observation_space = spaces.Box(0.0, np.inf, (2,), np.float32)
        self.action_space = spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        return np.array([self.episode, self.step_in_episode], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.episode, self.step_in_episode = next(_EPISODES), 0
        self.length = self.lengths[self.episodes_begun % len(self.lengths)]
        self.episodes_begun += 1
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.step_in_episode += 1
        return self._obs(), 0.0, False, self.step_in_episode >= self.length, {}


gym.register(
    "selftrunc/SelfTruncating-v0",
    entry_point="self_truncating_envs:SelfTruncating",
    max_episode_steps=100,
)
