"""SAC (Haarnoja et al. 2018) as CleanRL users know it: a tanh-squashed Gaussian policy,
twin critics with Polyak-averaged targets, delayed policy updates (``policy_frequency`` of
them each time), and an entropy coefficient tuned toward an entropy of -|A| (or fixed).

It shares TD3's pieces: the action bounds and squashing, the critics, the learners' and the
fused program's machinery (``rlspeed.core.algos.td3``). The policy's math below is written
once for every backend, as TD3's is: ``xp`` is ``jax.numpy`` or ``torch``, and its
standard-normal draws come in as arrays from the backend's own RNG (or a test's).
All step counts are environment steps, whatever ``num_envs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

from rlspeed.core.algos import (
    AlgoSpec,
    check_hidden_sizes,
    check_network_memory,
    check_ranges,
)
from rlspeed.core.algos.td3 import ActionBounds, check_exploration, squash

if TYPE_CHECKING:
    from types import ModuleType

    from rlspeed.config import RunConfig
    from rlspeed.core.algos.td3 import BackendArray, Carried

# The policy's log std lives in [LOG_STD_MIN, LOG_STD_MAX] (a tanh rescaled onto it, as
# CleanRL's): never so narrow that log-probabilities blow up, never wider than useful.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
# Keeps the tanh correction's log finite where an action saturates (CleanRL's epsilon).
SQUASH_EPSILON = 1e-6


@dataclass(frozen=True)
class SACConfig:
    name: str = "sac"
    # Inputs of the fused program, not constants in it (``rlspeed.core.algos.loops.fused_training.
    # traced_values``): runs differing only in these share one compiled program.
    TRACED: ClassVar[tuple[str, ...]] = (
        "q_lr",
        "policy_lr",
        "gamma",
        "tau",
        "alpha",
        "ou_theta",
        "ou_dt",
    )
    # Step sizes of the critics (and of the entropy coefficient) and of the policy.
    q_lr: float = 1e-3
    policy_lr: float = 3e-4
    buffer_size: int = 1_000_000
    batch_size: int = 256
    gamma: float = 0.99
    # Polyak factor of the target critics, moved after every critic update.
    tau: float = 0.005
    # Entropy coefficient: fixed, or where its tuning starts with ``autotune``.
    alpha: float = 0.2
    # Tune alpha so the policy's entropy tends to -|A| (the action's dimensions).
    autotune: bool = True
    # Every policy_frequency-th critic update is followed by policy_frequency policy
    # updates: as many policy as critic updates in all, in bursts.
    policy_frequency: int = 2
    # Env steps per gradient update (1 -> one update per env step).
    train_frequency: int = 1
    # Uniformly random actions before this env step; updates start here too.
    learning_starts: int = 5_000
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    # The standard-normal draws the policy's exploratory actions are made of: "gaussian"
    # draws them afresh at every step; "ou" makes them an Ornstein-Uhlenbeck process of unit
    # variance per env that starts at 0 with each episode, so that every action is still
    # drawn from the policy's Gaussian but pushes the same way for about
    # 1 / (ou_theta * ou_dt) steps (what finds MountainCarContinuous-v0's goal, where
    # fresh draws cancel out). Training's own draws stay independent.
    exploration: str = "gaussian"
    # Each step keeps 1 - ou_theta * ou_dt of the last draw (TD3's process, rescaled).
    ou_theta: float = 0.15
    ou_dt: float = 0.01


def gaussian(out: BackendArray, xp: ModuleType) -> tuple[Any, Any]:
    """The policy network's output -> the Gaussian's mean and log std (its last axis holds
    the means, then the unbounded log stds)."""
    half = out.shape[-1] // 2
    log_std = xp.tanh(out[..., half:])
    return out[..., :half], LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)


def sample(
    out: BackendArray, normal: BackendArray, bounds: ActionBounds, xp: ModuleType
) -> tuple[Any, Any]:
    """Actions drawn with the standard-normal ``normal`` and squashed into the bounds, and
    their log-probabilities [B] (the Gaussian's, corrected for the tanh and the scaling)."""
    mean, log_std = gaussian(out, xp)
    squashed = xp.tanh(mean + xp.exp(log_std) * normal)
    log_prob = -0.5 * normal**2 - log_std - LOG_SQRT_2PI
    log_prob = log_prob - xp.log(bounds.scale * (1 - squashed**2) + SQUASH_EPSILON)
    return squashed * bounds.scale + bounds.center, xp.sum(log_prob, axis=-1)


def draw_normal(carried: Carried, normal: BackendArray, algo: SACConfig) -> tuple[Any, Carried]:
    """This step's standard-normal draws per env for the policy's exploratory actions,
    from fresh draws ``normal``, and what is carried to the next step: with OU
    exploration, ``carried`` moved on (each entry keeps ``kept`` of itself and adds
    sqrt(1 - kept**2) of ``normal``: unit variance once the process has run a while);
    with Gaussian exploration ``normal`` itself, ``carried`` as is."""
    if algo.exploration == "ou":
        kept = 1.0 - algo.ou_theta * algo.ou_dt
        # An OU learner carries an array of its backend (the TypeVar cannot say which).
        moved: Any = cast("Any", carried) * kept + normal * (1.0 - kept**2) ** 0.5
        return moved, moved
    return normal, carried


def greedy_actions(out: BackendArray, bounds: ActionBounds, xp: ModuleType) -> Any:
    """The deterministic policy: the squashed mean."""
    return squash(gaussian(out, xp)[0], bounds, xp)


def validate(algo: SACConfig, cfg: RunConfig) -> None:
    check_ranges(
        algo,
        count=("policy_frequency",),
        unit=("gamma",),
        step=("tau",),
        positive=("q_lr", "policy_lr", "alpha"),
    )
    check_exploration(algo)
    check_hidden_sizes(algo)
    # Until policy_frequency critic updates, the policy (the trained agent) never moves.
    # Imported here: the replay module loads NumPy, which a config error is printed without.
    from rlspeed.core.algos.replay import check_replay

    check_replay(algo, cfg, min_updates=algo.policy_frequency)
    check_network_memory(cfg)


SPEC = AlgoSpec(
    name="sac",
    schema=SACConfig,
    action_kinds=("continuous",),
    # Its networks take observations as numbers: no one-hot encoding.
    observation_kinds=("continuous",),
    learners={
        "torch": "rlspeed.core.algos.sac.torch:TorchLearner",
        "flax": "rlspeed.core.algos.sac.flax:FlaxLearner",
    },
    fused="rlspeed.core.algos.sac.flax:make_train",
    validate=validate,
)
