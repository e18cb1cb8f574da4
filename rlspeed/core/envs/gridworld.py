"""GridWorld: walk from the bottom-right corner of a square grid to the top-left one.

Two implementations with identical dynamics: :class:`GridWorldEnv` here, a plain
:class:`gymnasium.Env` with Python-int steps, and its pure-JAX twin
:class:`rlspeed.core.envs.gridworld_jax.GridWorldFunctional`, kept apart so that the plain env
never loads JAX.

Layout: a ``size`` x ``size`` grid; the agent starts in the bottom-right cell and the goal
is the top-left cell. Actions: 0 right, 1 down, 2 left, 3 up; a move off the grid leaves
the agent in place. The reward is 1.0 on the step that reaches the goal, else 0.0, and the
episode terminates there. The observation is the agent's cell index ``row * size + col``,
which is also the tabular state.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

# (row delta, col delta) per action: 0 right, 1 down, 2 left, 3 up.
MOVES: tuple[tuple[int, int], ...] = ((0, 1), (1, 0), (0, -1), (-1, 0))
GOAL_CELL = 0  # top-left


def start_cell(size: int) -> int:
    """Index of the bottom-right cell, where every episode starts."""
    return size * size - 1


def grid_spaces(size: int) -> tuple[spaces.Discrete[np.int32], spaces.Discrete[np.int64]]:
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    # int32 observations: the dtype JAX produces with x64 disabled, so the NumPy and JAX
    # engines (and the replay buffers built from this space) agree.
    return spaces.Discrete(size * size, dtype=np.int32), spaces.Discrete(len(MOVES))


def render_ansi(cell: int, size: int) -> str:
    """Text picture of the grid: ``A`` agent, ``G`` goal (hidden under the agent), ``.`` empty."""
    chars = ["."] * (size * size)
    chars[GOAL_CELL] = "G"
    chars[cell] = "A"
    return "\n".join("".join(chars[r * size : (r + 1) * size]) for r in range(size)) + "\n"


# Observations: the Python ints it returns, or the space's NumPy int32.
class GridWorldEnv(gymnasium.Env[int | np.int32, np.int64]):
    """Python implementation of GridWorld.

    No time limit is applied here; the registered ``rlspeed/GridWorld-v0`` wraps it in
    :class:`gymnasium.wrappers.TimeLimit`.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, size: int = 5, render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"unsupported render_mode {render_mode!r}")
        self.size = size
        self.render_mode = render_mode
        self.observation_space, self.action_space = grid_spaces(size)
        self._row = self._col = size - 1

    def _obs(self) -> int:
        return self._row * self.size + self._col

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        self._row = self._col = self.size - 1
        return self._obs(), {}

    def step(self, action: int | np.integer) -> tuple[int, float, bool, bool, dict[str, Any]]:
        """Move the agent, clamped to the grid."""
        a = int(action)
        if not 0 <= a < len(MOVES):
            raise ValueError(f"invalid action {action!r}")
        d_row, d_col = MOVES[a]
        last = self.size - 1
        # Moves change one coordinate, so clamping it is "stay in place" at an edge.
        self._row = min(max(self._row + d_row, 0), last)
        self._col = min(max(self._col + d_col, 0), last)
        terminated = self._obs() == GOAL_CELL
        return self._obs(), float(terminated), terminated, False, {}

    def render(self) -> str | None:
        """Return the grid as text in ``ansi`` mode."""
        if self.render_mode is None:
            gymnasium.logger.warn(
                'render() called without a render_mode; create the env with render_mode="ansi".'
            )
            return None
        return render_ansi(self._obs(), self.size)
