"""Every random stream of a run, derived from its one ``seed``.

``numpy.random.SeedSequence(seed)`` spawns one child per purpose (its ``spawn_key``), so
no two streams of a run share state, nor does any stream of one seed share state with
another seed's: env ``i`` of seed 1 is not env ``i - 1`` of seed 2 (as seeding env ``i``
with ``seed + i`` made it), and the replay draws are neither env 0's nor the weight init's.
Evaluation episodes have a purpose of their own, so they never replay a training env.
Inside a jitted loop, a purpose's JAX key is split further by JAX (independent by design).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np


class Stream(IntEnum):
    """The purposes a run draws random numbers for (the first word of the spawn key)."""

    ENV = 0  # training env copy i: spawn key (ENV, i)
    EVAL = 1  # evaluation episode i: (EVAL, i)
    INIT = 2  # network weights
    ACT = 3  # exploration and action sampling (and on the fused path, the updates' draws)
    REPLAY = 4  # replay-buffer batches


def sequence(seed: int, stream: Stream, index: int | None = None) -> np.random.SeedSequence:
    """The ``SeedSequence`` of one stream: child ``stream`` (then ``index``) of ``seed``'s."""
    spawn_key = (int(stream),) if index is None else (int(stream), index)
    return np.random.SeedSequence(seed, spawn_key=spawn_key)


def int_seed(seed: int, stream: Stream, index: int | None = None) -> int:
    """A 64-bit integer seed of the stream, for what takes integers (Gymnasium, torch)."""
    return int(sequence(seed, stream, index).generate_state(1, np.uint64)[0])


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Reset seeds of the training env copies ``0 .. num_envs - 1``."""
    return [int_seed(seed, Stream.ENV, i) for i in range(num_envs)]


def eval_seeds(seed: int, episodes: int) -> list[int]:
    """Reset seeds of evaluation episodes ``0 .. episodes - 1``: held out from training."""
    return [int_seed(seed, Stream.EVAL, i) for i in range(episodes)]


def numpy_rng(seed: int, stream: Stream) -> np.random.Generator:
    return np.random.default_rng(sequence(seed, stream))


def jax_key(seed: int | Sequence[int], stream: Stream) -> Any:
    """A JAX key (of JAX's default kind) of the stream; for a list of seeds, their keys
    stacked on a leading axis (agent ``i`` of a vmapped run gets seed ``i``'s key)."""
    import jax
    import jax.numpy as jnp

    words = jax.random.key_data(jax.random.key(0)).size
    seeds = [seed] if isinstance(seed, int) else list(seed)
    data = np.stack([sequence(s, stream).generate_state(words, np.uint32) for s in seeds])
    return jax.random.wrap_key_data(jnp.asarray(data[0] if isinstance(seed, int) else data))


class JaxKeys(NamedTuple):
    """The JAX keys a fused training starts from (a pytree: vmap it over seeds)."""

    init: Any
    env: Any
    act: Any


def jax_keys(seed: int | Sequence[int]) -> JaxKeys:
    return JaxKeys(*(jax_key(seed, stream) for stream in (Stream.INIT, Stream.ENV, Stream.ACT)))
