"""TD3 (Fujimoto et al. 2018) as CleanRL users know it: a deterministic tanh actor, twin
critics, target policy smoothing, delayed actor and target updates, Gaussian exploration.

The action math below is written once for every backend: ``xp`` is ``numpy``,
``jax.numpy`` or ``torch`` (each has ``tanh`` and ``clip`` with array bounds), and the
random draws come in as standard-normal or uniform arrays from the backend's own RNG.
All step counts are environment steps, whatever ``num_envs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeVar

from rlspeed.core.algos import (
    AlgoSpec,
    check_hidden_sizes,
    check_network_memory,
    check_ranges,
)

if TYPE_CHECKING:
    from types import ModuleType

    import jax
    import numpy as np
    import torch
    from gymnasium import spaces

    from rlspeed.config import RunConfig

    # One backend's arrays, the same for every array argument of a call: the action math
    # runs on NumPy, JAX and torch alike.
    BackendArray = TypeVar("BackendArray", np.ndarray, jax.Array, torch.Tensor)


@dataclass(frozen=True)
class TD3Config:
    name: str = "td3"
    # Inputs of the fused program, not constants in it (``rlspeed.core.algos.loops.fused_training.
    # traced_values``): runs differing only in these share one compiled program.
    TRACED: ClassVar[tuple[str, ...]] = (
        "learning_rate",
        "gamma",
        "tau",
        "policy_noise",
        "noise_clip",
        "exploration_noise",
    )
    learning_rate: float = 3e-4
    buffer_size: int = 1_000_000
    batch_size: int = 256
    gamma: float = 0.99
    # Polyak factor of the target networks (1.0 copies the online networks).
    tau: float = 0.005
    # Target policy smoothing noise and its clip, in units of half the action range.
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    # Exploration noise std, in units of half the action range.
    exploration_noise: float = 0.1
    # Critic updates per actor (and target) update.
    policy_frequency: int = 2
    # Env steps per gradient update (1 -> one update per env step).
    train_frequency: int = 1
    # Uniformly random actions before this env step; updates start here too.
    learning_starts: int = 25_000
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])


class ActionBounds(NamedTuple):
    """A Box action space as arrays of one backend: actions live in ``[low, high]``."""

    low: Any
    high: Any
    scale: Any  # half the range: tanh's [-1, 1] maps onto [low, high]
    center: Any


def action_bounds(
    space: spaces.Box, as_array: Callable[[np.ndarray], Any] | None = None
) -> ActionBounds:
    """``space``'s bounds as float32 arrays, each passed through ``as_array`` (NumPy's
    by default; torch.from_numpy or jnp.asarray for the learners)."""
    import numpy as np  # here, not above: config checks read this module without NumPy

    low, high = (np.asarray(b, dtype=np.float32) for b in (space.low, space.high))
    bounds: tuple[np.ndarray, ...] = (low, high, (high - low) / 2, (high + low) / 2)
    return ActionBounds(*(bounds if as_array is None else map(as_array, bounds)))


def squash(x: BackendArray, bounds: ActionBounds, xp: ModuleType) -> Any:
    """The actor's output layer: unbounded ``x`` -> actions in ``[low, high]``."""
    return xp.tanh(x) * bounds.scale + bounds.center


def uniform_actions(uniform: BackendArray, bounds: ActionBounds) -> Any:
    """Uniform draws in [0, 1) -> uniformly random actions (before ``learning_starts``)."""
    return bounds.low + uniform * (bounds.high - bounds.low)


def explore(
    actions: BackendArray,
    normal: BackendArray,
    bounds: ActionBounds,
    algo: TD3Config,
    xp: ModuleType,
) -> Any:
    """Gaussian exploration around the actor's actions, kept inside the bounds."""
    noisy = actions + normal * (algo.exploration_noise * bounds.scale)
    return xp.clip(noisy, bounds.low, bounds.high)


def smoothed_target_actions(
    actions: BackendArray,
    normal: BackendArray,
    bounds: ActionBounds,
    algo: TD3Config,
    xp: ModuleType,
) -> Any:
    """Target policy smoothing: clipped Gaussian noise on the target actor's actions."""
    limit = algo.noise_clip * bounds.scale
    noise = xp.clip(normal * (algo.policy_noise * bounds.scale), -limit, limit)
    return xp.clip(actions + noise, bounds.low, bounds.high)


class DelayedActor(Protocol):
    """What ``is_actor_step`` reads of an algorithm's config (TD3's, SAC's)."""

    @property
    def policy_frequency(self) -> int: ...


def is_actor_step(updates: int | jax.Array, algo: DelayedActor) -> Any:
    """Whether critic update number ``updates`` (counted from 1) also updates the actor."""
    return updates % algo.policy_frequency == 0


def validate(algo: TD3Config, cfg: RunConfig) -> None:
    check_ranges(
        algo,
        count=("policy_frequency",),
        unit=("gamma",),
        step=("tau",),
        non_negative=("policy_noise", "noise_clip", "exploration_noise"),
        positive=("learning_rate",),
    )
    check_hidden_sizes(algo)
    # Until policy_frequency critic updates, the actor (the trained policy) never moves.
    # Imported here: the replay module loads NumPy, which a config error is printed without.
    from rlspeed.core.algos.replay import check_replay

    check_replay(algo, cfg, min_updates=algo.policy_frequency)
    check_network_memory(cfg)


SPEC = AlgoSpec(
    name="td3",
    schema=TD3Config,
    action_kinds=("continuous",),
    # Its networks take observations as numbers: no one-hot encoding.
    observation_kinds=("continuous",),
    learners={
        "torch": "rlspeed.core.algos.td3.torch:TorchLearner",
        "flax": "rlspeed.core.algos.td3.flax:FlaxLearner",
    },
    fused="rlspeed.core.algos.td3.flax:make_train",
    validate=validate,
)
