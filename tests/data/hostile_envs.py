"""Envs that are hostile to rlspeed's checks in the ways a user's package can be, registered
for ``task.import=tests.data.hostile_envs``: each is a corridor (walk right to the last
cell, -1 per step) with one thing wrong, or a keyword that shows what ``gym.make`` got."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Corridor(gym.Env):
    """Four cells, observed as the cell (Discrete); or, sized by its keywords, as ``entries``
    values of ``classes`` classes (MultiDiscrete) or a ``Box`` of ``box_shape`` (all zeros);
    ``actions`` actions (1 is right, any other left)."""

    def __init__(
        self,
        classes: int | None = None,
        entries: int = 1,
        box_shape: list[int] | None = None,
        actions: int = 2,
    ) -> None:
        self.observation_space: spaces.Space = spaces.Discrete(4)
        if classes is not None:
            self.observation_space = spaces.MultiDiscrete([classes] * entries)
        if box_shape is not None:
            self.observation_space = spaces.Box(0.0, 1.0, tuple(box_shape), np.float32)
        self.action_space = spaces.Discrete(actions)
        self.cell = 0

    def _obs(self) -> Any:
        return self.observation_space.sample() * 0  # every entry 0: any shape, from zero

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.cell = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.cell = min(max(self.cell + (1 if action == 1 else -1), 0), 3)
        return self._obs(), -1.0, self.cell == 3, False, {}


class FailingClose(Corridor):
    """Fails as it closes; with ``late``, only once it has stepped (as the check's probe of
    the env never does)."""

    def __init__(self, late: bool = False) -> None:
        super().__init__()
        self.late, self.stepped = late, False

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.stepped = True
        return super().step(action)

    def close(self) -> None:
        if self.stepped or not self.late:
            raise RuntimeError("the simulator's socket is already gone")


class Endless(Corridor):
    """Never ends on its own."""

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        return self._obs(), -1.0, False, False, {}


class SaysUrl(Corridor):
    """Fails to start unless it gets the URL with its password, as a client would."""

    def __init__(self, url: str) -> None:
        if url != "https://user:secret@host/x":
            raise ConnectionError(f"login refused at {url}")
        super().__init__()
        self.url = url


def _register(name: str, entry_point: Any, **kwargs: Any) -> None:
    gym.register(f"hostile/{name}-v0", entry_point=entry_point, **kwargs)


_register("FailingClose", FailingClose, max_episode_steps=20)
_register("FailingCloseLate", FailingClose, max_episode_steps=20, kwargs={"late": True})
_register("Endless", Endless, max_episode_steps=10**9)
_register("NoLimit", Endless)
_register("Url", SaysUrl, max_episode_steps=20)
_register("Sized", Corridor, max_episode_steps=20)
