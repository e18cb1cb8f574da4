"""TD3 (Fujimoto et al. 2018) as CleanRL users know it: a deterministic tanh actor, twin
critics, target policy smoothing, delayed actor and target updates, Gaussian exploration
(or, with ``exploration=ou``, the Ornstein-Uhlenbeck noise of DDPG and RL Zoo).

The action math below is written once for every backend: ``xp`` is ``numpy``,
``jax.numpy`` or ``torch`` (each has ``tanh`` and ``clip`` with array bounds), and the
random draws come in as standard-normal or uniform arrays from the backend's own RNG.
All step counts are environment steps, whatever ``num_envs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeVar, cast

from rlspeed.core.algos import (
    AlgoSpec,
    check_hidden_sizes,
    check_network_memory,
    check_ranges,
)
from rlspeed.errors import ConfigError

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
    # The exploration noise a learner carries between steps (an array, or () for none).
    Carried = TypeVar("Carried")


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
        "ou_theta",
        "ou_dt",
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
    # Exploration noise: "gaussian" draws it afresh at every step; "ou" makes it an
    # Ornstein-Uhlenbeck process per env that starts at 0 with each episode. Its steps are
    # correlated, so it pushes one way for many steps: what finds a sparse reward behind a
    # cost on actions (MountainCarContinuous-v0's goal).
    exploration: str = "gaussian"
    # Exploration noise std (the OU process's sigma), in units of half the action range.
    exploration_noise: float = 0.1
    # The OU process: its pull back towards 0 and its time step, SB3's defaults. Each step
    # keeps 1 - ou_theta * ou_dt of the last noise and adds sigma * sqrt(ou_dt) of new draws.
    ou_theta: float = 0.15
    ou_dt: float = 0.01
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


EXPLORATIONS = ("gaussian", "ou")


class OUExploring(Protocol):
    """What ``check_exploration`` reads of an algorithm's config (TD3's, SAC's)."""

    @property
    def exploration(self) -> str: ...
    @property
    def ou_theta(self) -> float: ...
    @property
    def ou_dt(self) -> float: ...


def check_exploration(algo: OUExploring) -> None:
    """``algo.exploration`` is one of ``EXPLORATIONS``, and its OU process keeps
    1 - ou_theta * ou_dt of itself per step, in [0, 1): the process stays bounded."""
    if algo.exploration not in EXPLORATIONS:
        raise ConfigError("algo.exploration", algo.exploration, f"one of {', '.join(EXPLORATIONS)}")
    check_ranges(algo, positive=("ou_theta", "ou_dt"))
    if not algo.ou_theta * algo.ou_dt <= 1.0:
        allowed = f"ou_theta * ou_dt <= 1 (algo.ou_dt={algo.ou_dt})"
        raise ConfigError("algo.ou_theta", algo.ou_theta, allowed)


def draw_noise(noise: Carried, normal: BackendArray, algo: TD3Config) -> tuple[Any, Carried]:
    """This step's exploration noise per env (in units of half the action range) from
    fresh standard-normal draws ``normal``, and the noise carried to the next step: OU
    noise moves on from the last step's ``noise``; Gaussian noise carries ``noise`` as is."""
    if algo.exploration == "ou":
        kept = 1.0 - algo.ou_theta * algo.ou_dt
        # An OU learner carries an array of its backend (the TypeVar cannot say which).
        moved: Any = cast("Any", noise) * kept + normal * (algo.exploration_noise * algo.ou_dt**0.5)
        return moved, moved
    return normal * algo.exploration_noise, noise


def restart_noise(noise: BackendArray, ended: BackendArray) -> Any:
    """``noise`` with the rows of the envs whose episode ``ended`` (bool [num_envs]) back at
    0: each episode's OU process starts afresh, as in SB3."""
    return noise * ~ended.reshape(ended.shape + (1,) * (noise.ndim - 1))


def explore(
    actions: BackendArray, noise: BackendArray, bounds: ActionBounds, xp: ModuleType
) -> Any:
    """The actor's actions plus exploration ``noise`` (``draw_noise``), kept inside the
    bounds."""
    return xp.clip(actions + noise * bounds.scale, bounds.low, bounds.high)


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
    check_exploration(algo)
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
