"""What every flax learner driven from Python shares (the host loops, Gymnasium engines)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from rlspeed.checkpoint import save_pytree
from rlspeed.seeding import Stream, jax_key


class JaxLearner:
    """A flax agent (a NamedTuple pytree of parameters and optimizer states) held between
    jitted calls, with the key its actions are drawn from; saved as the same pytree the
    fused path saves, so either path's checkpoint loads the same way."""

    def __init__(self, init: Callable[[jax.Array], Any], seed: int) -> None:
        self.key = jax_key(seed, Stream.ACT)
        # Jitted: one compilation instead of one per eager operation (half the time).
        self.agent = jax.jit(init)(jax_key(seed, Stream.INIT))

    def next_key(self) -> jax.Array:
        """A fresh key for one call's random draws."""
        self.key, key = jax.random.split(self.key)
        return key

    def save(self, path: Path) -> Path:
        return save_pytree(self.agent._asdict(), path)
