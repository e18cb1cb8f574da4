"""The shared MLP in Flax: observations (one-hot encoded where categorical) -> MLP."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    """Observations -> ``activation`` after each hidden layer -> ``out_size`` outputs."""

    out_size: int
    hidden_sizes: Sequence[int]
    classes: int  # one-hot classes per observation entry, 0 for continuous
    activation: Callable[[jax.Array], jax.Array] = nn.tanh

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        batch = obs.shape[0]
        if self.classes:
            x = jax.nn.one_hot(obs, self.classes).reshape(batch, -1)
        else:
            x = obs.reshape(batch, -1).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = self.activation(nn.Dense(size)(x))
        return nn.Dense(self.out_size)(x)
