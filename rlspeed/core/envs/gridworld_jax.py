"""GridWorld's pure-JAX twin: the dynamics of :class:`rlspeed.core.envs.gridworld.GridWorldEnv`
as a :class:`FuncEnv` whose every method can be jitted and vmapped (``env=jax-vmap``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from gymnasium.experimental.functional import FuncEnv

from rlspeed.core.envs.gridworld import GOAL_CELL, MOVES, grid_spaces, start_cell


class GridWorldFunctional(
    FuncEnv[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, None, None]
):
    """Pure-JAX twin of :class:`GridWorldEnv`; the state is the int32 cell index."""

    # Deterministic moves from a fixed start: VmapEnv draws no keys for it.
    transition_uses_rng = False
    initial_uses_rng = False

    def __init__(self, size: int = 5) -> None:
        super().__init__()
        self.size = size
        self.observation_space, self.action_space = grid_spaces(size)
        self._moves = jnp.asarray(MOVES, dtype=jnp.int32)

    def initial(self, rng: jax.Array | None = None, params: None = None) -> jax.Array:
        """The bottom-right cell (the start is deterministic; ``rng`` is unused)."""
        start: jax.Array = jnp.int32(start_cell(self.size))
        return start

    def transition(
        self,
        state: jax.Array,
        action: jax.Array | int,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array:
        """Apply a move, clamped to the grid."""
        move = self._moves[action]
        row = jnp.clip(state // self.size + move[0], 0, self.size - 1)
        col = jnp.clip(state % self.size + move[1], 0, self.size - 1)
        return (row * self.size + col).astype(jnp.int32)

    def observation(
        self, state: jax.Array, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        """The cell index itself (int32 scalar)."""
        return state

    def reward(
        self,
        state: jax.Array,
        action: jax.Array | int,
        next_state: jax.Array,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array:
        """1.0 when the move lands on the goal, else 0.0 (float32)."""
        return self.terminal(next_state).astype(jnp.float32)

    def terminal(
        self, state: jax.Array, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        """True when the agent stands on the goal."""
        return state == GOAL_CELL
