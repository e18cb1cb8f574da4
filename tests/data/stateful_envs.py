"""Envs that keep their state in Python containers, for the resume tests of ``task=gym``
(``task.import=tests.data.stateful_envs``). Each is the same walk: cells 0 to ``cells - 1``
(8 unless ``task.kwargs`` says), action 1 steps right and 0 left, and a step onto a cell not
yet visited in the episode pays 1 (one already visited 0); an episode starts on a random
cell. The observation is (cell, step).

The walks differ in where they keep the cells visited: a list of ints and a dict of ints
(which rlspeed saves by itself), a deque (which it cannot: refused), and a deque behind the
``rlspeed_get_state`` / ``rlspeed_set_state`` hook (which it saves through the hook).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ListWalk(gym.Env):
    """The cells visited this episode in a list, in order (the last is where it stands)."""

    def __init__(self, cells: int = 8) -> None:
        self.cells = cells
        self.observation_space = spaces.Box(0.0, np.inf, (2,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._start(int(self.np_random.integers(self.cells)))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        cell = min(max(self._cell() + (1 if action == 1 else -1), 0), self.cells - 1)
        reward = 0.0 if self._visited(cell) else 1.0
        self._visit(cell)
        return self._obs(), reward, False, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self._cell(), self._steps()], dtype=np.float32)

    def _start(self, cell: int) -> None:
        self.trail = [cell]

    def _cell(self) -> int:
        return self.trail[-1]

    def _steps(self) -> int:
        return len(self.trail) - 1

    def _visited(self, cell: int) -> bool:
        return cell in self.trail

    def _visit(self, cell: int) -> None:
        self.trail.append(cell)


class DictWalk(ListWalk):
    """Where it stands and its steps in one dict, how often it visited each cell this
    episode in another (int keys)."""

    def _start(self, cell: int) -> None:
        self.walk = {"cell": cell, "steps": 0}
        self.visits = {cell: 1}

    def _cell(self) -> int:
        return self.walk["cell"]

    def _steps(self) -> int:
        return self.walk["steps"]

    def _visited(self, cell: int) -> bool:
        return cell in self.visits

    def _visit(self, cell: int) -> None:
        self.visits[cell] = self.visits.get(cell, 0) + 1
        self.walk = {"cell": cell, "steps": self.walk["steps"] + 1}


class DequeWalk(ListWalk):
    """The cells visited in a deque: an object rlspeed cannot save."""

    def _start(self, cell: int) -> None:
        self.trail = deque([cell])  # type: ignore[assignment]


class HookedDequeWalk(DequeWalk):
    """DequeWalk that hands rlspeed its deque as a list, and takes it back."""

    def rlspeed_get_state(self) -> dict[str, Any]:
        return {"trail": list(self.trail)}

    def rlspeed_set_state(self, state: dict[str, Any]) -> None:
        self.trail = deque(state["trail"])  # type: ignore[assignment]


for _name in ("ListWalk", "DictWalk", "DequeWalk", "HookedDequeWalk"):
    gym.register(f"stateful/{_name}-v0", entry_point=f"{__name__}:{_name}", max_episode_steps=20)
