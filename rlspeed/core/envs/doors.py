"""The "Doors" gridworld: cross a wall through one of a few doors to reach a goal.

Two implementations with identical dynamics: :class:`DoorsEnv` here, a plain NumPy
:class:`gymnasium.Env` tuned for cheap steps, and its pure-JAX twin
:class:`rlspeed.core.envs.doors_jax.DoorsFunctional`, kept apart so that the NumPy env, and the
settings checks that read this module's constants, never load JAX.

Layout: a ``grid_size`` x ``grid_size`` grid whose middle row is a wall except for
``n_doors`` one-cell gaps. The agent starts in the bottom row at column ``c`` and the
goal sits in the top row at column ``W - 1 - c``. The reward of a step is the decrease
of the Euclidean distance to the goal, so an episode's return telescopes to
(initial distance - final distance).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

# Cell codes used in observations.
EMPTY = 0
AGENT = 1
WALL = 2
GOAL = 3
N_CELL_TYPES = 4

# (row delta, col delta) per action: 0 stay, 1 right, 2 down, 3 left, 4 up.
MOVES: tuple[tuple[int, int], ...] = ((0, 0), (0, 1), (1, 0), (0, -1), (-1, 0))

_ANSI_CHARS = {EMPTY: ".", AGENT: "A", WALL: "#", GOAL: "G"}


def doors_columns(grid_size: int, n_doors: int) -> list[int]:
    """Columns of the door gaps in the middle wall row."""
    if n_doors < 1 or n_doors > grid_size:
        raise ValueError(f"n_doors must be in [1, {grid_size}], got {n_doors}")
    spacing = grid_size // n_doors
    return [spacing * (d + 1) - 1 for d in range(n_doors)]


def wall_mask(grid_size: int, n_doors: int) -> np.ndarray:
    """Boolean ``[H, W]`` mask of wall cells (middle row minus the doors)."""
    if grid_size < 3:
        raise ValueError(f"grid_size must be >= 3, got {grid_size}")
    walls = np.zeros((grid_size, grid_size), dtype=bool)
    walls[grid_size // 2, :] = True
    walls[grid_size // 2, doors_columns(grid_size, n_doors)] = False
    return walls


def doors_observation_space(grid_size: int) -> spaces.MultiDiscrete[np.int8]:
    return spaces.MultiDiscrete(np.full(grid_size * grid_size, N_CELL_TYPES), dtype=np.int8)


def render_ansi(obs: np.ndarray, grid_size: int) -> str:
    """Text picture of a flattened observation, one line per row."""
    grid = np.asarray(obs).reshape(grid_size, grid_size)
    return "\n".join("".join(_ANSI_CHARS[int(v)] for v in row) for row in grid) + "\n"


class DoorsEnv(gymnasium.Env[np.ndarray, np.int64]):
    """NumPy implementation of the Doors gridworld.

    No time limit is applied here; the registered ``rlspeed/Doors-v0`` wraps it in
    :class:`gymnasium.wrappers.TimeLimit`.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self, grid_size: int = 15, n_doors: int = 3, render_mode: str | None = None
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"unsupported render_mode {render_mode!r}")
        self.grid_size = grid_size
        self.n_doors = n_doors
        self.render_mode = render_mode

        walls = wall_mask(grid_size, n_doors)
        # The per-step observation is a copy of this plus two cell writes.
        self._base_obs = np.where(walls, WALL, EMPTY).astype(np.int8).ravel()
        # Nested Python lists make the scalar wall lookup in step() cheaper than
        # indexing a NumPy array.
        self._walls: list[list[bool]] = walls.tolist()

        self.observation_space = doors_observation_space(grid_size)
        self.action_space = spaces.Discrete(len(MOVES))

        self._place(0)

    def _place(self, start_col: int) -> None:
        last = self.grid_size - 1
        self._row, self._col = last, start_col
        self._goal_row, self._goal_col = 0, last - start_col
        self._goal_idx = self._goal_col  # row 0, so the flat index is the column
        self._dist = self._distance()

    def _distance(self) -> float:
        return math.hypot(self._goal_row - self._row, self._goal_col - self._col)

    def _obs(self) -> np.ndarray:
        obs = self._base_obs.copy()
        obs[self._goal_idx] = GOAL
        # Written last so the agent is drawn over the goal.
        obs[self._row * self.grid_size + self._col] = AGENT
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; ``options={"start_col": c}`` forces the start column."""
        super().reset(seed=seed)
        if options is not None and "start_col" in options:
            col = int(options["start_col"])
            if not 0 <= col < self.grid_size:
                raise ValueError(f"start_col must be in [0, {self.grid_size}), got {col}")
        else:
            col = int(self.np_random.integers(self.grid_size))
        self._place(col)
        return self._obs(), {}

    def step(
        self, action: int | np.integer
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move the agent; moves into walls or off the grid leave it in place."""
        a = int(action)
        if not 0 <= a < len(MOVES):
            raise ValueError(f"invalid action {action!r}")
        d_row, d_col = MOVES[a]
        row, col = self._row + d_row, self._col + d_col
        size = self.grid_size
        if 0 <= row < size and 0 <= col < size and not self._walls[row][col]:
            self._row, self._col = row, col

        dist = self._distance()
        # Computed in float64; callers treat it as float32 (the JAX twin's dtype).
        reward = self._dist - dist
        self._dist = dist
        terminated = self._row == self._goal_row and self._col == self._goal_col
        return self._obs(), reward, terminated, False, {}

    def render(self) -> str | None:
        """Return the grid as text in ``ansi`` mode."""
        if self.render_mode is None:
            gymnasium.logger.warn(
                'render() called without a render_mode; create the env with render_mode="ansi".'
            )
            return None
        return render_ansi(self._obs(), self.grid_size)
