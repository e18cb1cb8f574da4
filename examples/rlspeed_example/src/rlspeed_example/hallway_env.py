"""The Hallway env: cells 0 .. length-1, the agent starts in cell 0 and is rewarded 1 for
reaching the last cell, which ends the episode. Actions: 0 steps left, 1 steps right."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class HallwayEnv(gym.Env):
    def __init__(self, length: int) -> None:
        self.length = length
        self.observation_space = gym.spaces.Discrete(length)
        self.action_space = gym.spaces.Discrete(2)
        self.cell = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        self.cell = 0
        return self.cell, {}

    def step(self, action: Any) -> tuple[int, float, bool, bool, dict[str, Any]]:
        move = 1 if int(action) == 1 else -1
        self.cell = int(np.clip(self.cell + move, 0, self.length - 1))
        at_goal = self.cell == self.length - 1
        return self.cell, float(at_goal), at_goal, False, {}
