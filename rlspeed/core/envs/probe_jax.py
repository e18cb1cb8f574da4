"""The probes' pure-JAX twin: the dynamics of :class:`rlspeed.core.envs.probe.ProbeEnv` as a
:class:`FuncEnv` whose every method can be jitted and vmapped (``env=jax-vmap``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from gymnasium.experimental.functional import FuncEnv

from rlspeed.core.envs.probe import (
    RANDOM_START,
    TERMINATED,
    check_kind,
    move,
    observe,
    probe_spaces,
    reward,
)


class ProbeFunctional(FuncEnv[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, None, None]):
    """Pure-JAX twin of :class:`ProbeEnv`; the state is the int32 ``s`` (``s + 2`` once
    terminated)."""

    # Deterministic moves; only the observation and action probes draw their start state.
    transition_uses_rng = False

    def __init__(
        self, kind: str = "constant", actions: str = "discrete", observations: str = "continuous"
    ) -> None:
        super().__init__()
        check_kind(kind)
        self.kind, self.actions, self.observations = kind, actions, observations
        self.observation_space, self.action_space = probe_spaces(actions, observations)
        self.initial_uses_rng = kind in RANDOM_START

    def initial(self, rng: jax.Array | None = None, params: None = None) -> jax.Array:
        """State 0 or 1 drawn uniformly (observation and action probes), else state 0.
        ``rng``: None where nothing is drawn (``initial_uses_rng`` False)."""
        start: jax.Array = (
            jax.random.randint(rng, (), 0, 2, dtype=jnp.int32)  # type: ignore[arg-type]
            if self.initial_uses_rng
            else jnp.int32(0)
        )
        return start

    def transition(
        self, state: jax.Array, action: jax.Array, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        return jnp.asarray(move(self.kind, state, jnp), dtype=jnp.int32)

    def observation(
        self, state: jax.Array, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        seen: jax.Array = observe(self.kind, self.observations, state, jnp)
        return seen

    def reward(
        self,
        state: jax.Array,
        action: jax.Array,
        next_state: jax.Array,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array:
        earned: jax.Array = reward(self.kind, self.actions, state, action, jnp)
        return earned

    def terminal(
        self, state: jax.Array, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        ended: jax.Array = state >= TERMINATED
        return ended
