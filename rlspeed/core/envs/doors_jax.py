"""Doors' pure-JAX twin: the dynamics of :class:`rlspeed.core.envs.doors.DoorsEnv` as a
:class:`FuncEnv` whose every method can be jitted and vmapped (``env=jax-vmap``)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from gymnasium.experimental.functional import FuncEnv

from rlspeed.core.envs.doors import (
    AGENT,
    EMPTY,
    GOAL,
    MOVES,
    WALL,
    doors_observation_space,
    wall_mask,
)


class DoorsState(NamedTuple):
    """State of the functional Doors env."""

    agent: jax.Array  # int32 [2]: (row, col)
    goal: jax.Array  # int32 [2]: (row, col)


class DoorsFunctional(FuncEnv[DoorsState, jax.Array, jax.Array, jax.Array, jax.Array, None, None]):
    """Pure-JAX twin of :class:`DoorsEnv`; every method is jit- and vmap-safe."""

    # Moves are deterministic; only the start column is random (VmapEnv).
    transition_uses_rng = False

    def __init__(self, grid_size: int = 15, n_doors: int = 3) -> None:
        super().__init__()
        self.grid_size = grid_size
        self.n_doors = n_doors
        walls = wall_mask(grid_size, n_doors)
        self._walls = jnp.asarray(walls)
        self._base_obs = jnp.asarray(np.where(walls, WALL, EMPTY).astype(np.int8).ravel())
        self._moves = jnp.asarray(MOVES, dtype=jnp.int32)
        self.observation_space = doors_observation_space(grid_size)
        self.action_space = spaces.Discrete(len(MOVES))

    def state_from_start_column(self, col: jax.Array | int) -> DoorsState:
        """State with the agent at ``(H-1, col)`` and the goal at ``(0, W-1-col)``; an
        array of columns gives a batch of states."""
        col = jnp.asarray(col, dtype=jnp.int32)
        last = jnp.full_like(col, self.grid_size - 1)
        agent = jnp.stack([last, col], axis=-1)
        goal = jnp.stack([jnp.zeros_like(col), last - col], axis=-1)
        return DoorsState(agent=agent, goal=goal)

    def initial(self, rng: jax.Array, params: None = None) -> DoorsState:
        """Random start column drawn uniformly from ``[0, W)``."""
        return self._random_starts(rng, ())

    def initial_batch(self, rng: jax.Array, num_envs: int) -> DoorsState:
        """``num_envs`` start states from one key: ``VmapEnv`` draws every env's reset at
        every step, and one call for all of them is far cheaper than one per env."""
        return self._random_starts(rng, (num_envs,))

    def _random_starts(self, rng: jax.Array, shape: tuple[int, ...]) -> DoorsState:
        # One 32-bit word modulo W (bias below W / 2**32): randint costs 3x as much on CPU.
        col = jax.random.bits(rng, shape, dtype=jnp.uint32) % self.grid_size
        return self.state_from_start_column(col.astype(jnp.int32))

    def transition(
        self,
        state: DoorsState,
        action: jax.Array | int,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> DoorsState:
        """Apply a move unless it would leave the grid or enter a wall."""
        target = state.agent + self._moves[action]
        in_bounds = jnp.all((target >= 0) & (target < self.grid_size))
        # Clip only so the wall lookup stays in range; in_bounds guards the result.
        safe = jnp.clip(target, 0, self.grid_size - 1)
        free = in_bounds & ~self._walls[safe[0], safe[1]]
        return state._replace(agent=jnp.where(free, target, state.agent))

    def observation(
        self, state: DoorsState, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        """Flattened int8 grid; the agent is drawn over the goal."""
        size = self.grid_size
        goal_idx = state.goal[0] * size + state.goal[1]
        agent_idx = state.agent[0] * size + state.agent[1]
        return self._base_obs.at[goal_idx].set(GOAL).at[agent_idx].set(AGENT)

    @staticmethod
    def _distance(state: DoorsState) -> jax.Array:
        diff = (state.agent - state.goal).astype(jnp.float32)
        return jnp.sqrt(jnp.sum(diff * diff))

    def reward(
        self,
        state: DoorsState,
        action: jax.Array | int,
        next_state: DoorsState,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array:
        """Decrease of the Euclidean distance to the goal (float32)."""
        return self._distance(state) - self._distance(next_state)

    def terminal(
        self, state: DoorsState, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        """True when the agent stands on the goal."""
        return jnp.all(state.agent == state.goal)
