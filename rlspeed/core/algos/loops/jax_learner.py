"""What every flax learner driven from Python shares (the host loops, Gymnasium engines)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from rlspeed.core.state import tree_from_host, tree_to_host, with_weights
from rlspeed.seeding import Stream, jax_key

if TYPE_CHECKING:
    from rlspeed.core import AgentCheckpoint, PyTree


class JaxLearner:
    """A flax agent (a NamedTuple pytree of parameters and optimizer states) held between
    jitted calls, with the key its actions are drawn from; saved as the same pytree the
    fused path saves, so either path's checkpoint loads the same way.

    A learner's ``state_dict`` (its resume state) holds ``agent_state()``, this class's
    part, and what the learner adds."""

    def __init__(self, init: Callable[[jax.Array], PyTree], seed: int) -> None:
        self.key = jax_key(seed, Stream.ACT)
        # Jitted: one compilation instead of one per eager operation (half the time).
        self.agent = jax.jit(init)(jax_key(seed, Stream.INIT))

    def next_key(self) -> jax.Array:
        """A fresh key for one call's random draws."""
        key: jax.Array
        self.key, key = jax.random.split(self.key)
        return key

    def agent_checkpoint(self) -> AgentCheckpoint:
        checkpoint: AgentCheckpoint = self.agent._asdict()
        return checkpoint

    def start_from(self, saved: AgentCheckpoint) -> None:
        """``init_from=``: the agent's weights from an agent file (``core.state.weights``)."""
        self.agent = with_weights(self.agent, saved)

    def agent_state(self) -> dict[str, Any]:
        """The key and the agent's arrays, as a resume file holds them."""
        return {"key": tree_to_host(self.key), "agent": tree_to_host(self.agent)}

    def load_agent_state(self, state: dict[str, Any]) -> None:
        self.key = tree_from_host(self.key, state["key"])
        self.agent = tree_from_host(self.agent, state["agent"])
