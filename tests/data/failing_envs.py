"""Envs whose own code fails at a set step, registered for
``task.import=tests.data.failing_envs``: a two-cell observation of zeros, -1 a step,
truncated every 50 steps, until step ``fail_at`` of each env copy, where ``how`` it fails:
``raise`` (an exception), ``exit`` (``sys.exit(0)``), ``kill`` (``os._exit(3)``, which ends
the process it runs in: a gym-async worker) or ``hang`` (sleeps for an hour)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class FailingCorridor(gym.Env):
    def __init__(self, fail_at: int = 2000, how: str = "raise") -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.fail_at, self.how, self.steps = fail_at, how, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.steps += 1
        if self.steps == self.fail_at:
            if self.how == "raise":
                raise RuntimeError("the simulator lost its licence")
            if self.how == "exit":
                sys.exit(0)
            if self.how == "hang":
                time.sleep(3600)
            os._exit(3)
        return np.zeros(2, np.float32), -1.0, False, self.steps % 50 == 0, {}


gym.register("failing/Corridor-v0", entry_point=FailingCorridor, max_episode_steps=100)
