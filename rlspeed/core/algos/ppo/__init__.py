"""PPO (proximal policy optimization) with the clipped surrogate objective, as CleanRL's
``ppo.py`` runs it: GAE(lambda) advantages, several epochs of minibatch steps per batch.

Each batch is ``num_steps`` steps of every env, with GAE advantages and value targets from
the on-policy rollouts (``rlspeed/core/algos/rollout.py``). Per batch, ``update_epochs``
passes over a fresh random permutation of it, each in ``num_minibatches`` minibatches; one
gradient step per minibatch on ``policy loss - ent_coef * entropy + vf_coef * value loss``,
with one Adam over the separate policy and value networks. ``updates``
(``gradient_updates`` in the outputs) counts those steps:
``update_epochs * num_minibatches`` per batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rlspeed.core.algos import (
    AlgoSpec,
    agents_at_once,
    check_hidden_sizes,
    check_memory,
    check_network,
    check_network_memory,
    check_ranges,
)
from rlspeed.errors import ConfigError
from rlspeed.machine import physical_memory
from rlspeed.registry import TASKS

if TYPE_CHECKING:
    from types import ModuleType

    import jax

    from rlspeed.config import RunConfig


class MinibatchSettings(Protocol):
    """What PPO's minibatched passes over a batch read of a config (PPO's, PQN's)."""

    @property
    def num_steps(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def anneal_lr(self) -> bool: ...
    @property
    def update_epochs(self) -> int: ...
    @property
    def num_minibatches(self) -> int: ...
    @property
    def max_grad_norm(self) -> float: ...


@dataclass(frozen=True)
class PPOConfig:
    name: str = "ppo"
    # Inputs of the fused program, not constants in it (``rlspeed.core.algos.loops.fused_training.
    # traced_values``): runs differing only in these share one compiled program.
    TRACED: ClassVar[tuple[str, ...]] = (
        "learning_rate",
        "gamma",
        "gae_lambda",
        "clip_coef",
        "ent_coef",
        "vf_coef",
    )
    # Steps per env in one batch (batch = num_steps * num_envs).
    num_steps: int = 128
    gamma: float = 0.99
    gae_lambda: float = 0.95
    # Adam's step size (eps 1e-5, as CleanRL's), shared by the policy and value networks.
    learning_rate: float = 2.5e-4
    # Decay the step size linearly from learning_rate to 0 over the run's batches.
    anneal_lr: bool = True
    # Passes over each batch; each pass a fresh random order.
    update_epochs: int = 4
    # Minibatches per pass, one gradient step each; must divide num_steps * num_envs.
    num_minibatches: int = 4
    # The surrogate's clip range: ratios new/old policy outside [1 - c, 1 + c] earn nothing.
    clip_coef: float = 0.2
    # Clip the value function's change from the rollout's values by clip_coef too.
    clip_vloss: bool = True
    # Entropy bonus coefficient (0: none).
    ent_coef: float = 0.01
    # Weight of the value loss (0.5 * mean squared error) in the total loss.
    vf_coef: float = 0.5
    # Global gradient-norm clipping over both networks (0: no clipping).
    max_grad_norm: float = 0.5
    # Normalise the advantages of each minibatch to mean 0, std 1.
    normalize_advantages: bool = True
    # Gaussian policies (continuous actions): the initial state-independent log std.
    initial_log_std: float = 0.0
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    # auto (a conv torso before the hidden layers for image observations, as MinAtar's),
    # mlp or cnn: NETWORKS in rlspeed/core/algos/networks/__init__.py.
    network: str = "auto"
    # Normalise observations by the running mean and variance of every observation acted on
    # (rlspeed/core/algos/normalization.py), clipped to +-obs_clip; the statistics are saved with
    # the agent. Continuous observations only. Off by default: on for the continuous tasks
    # (conf/algo_task/ppo_pendulum.yaml, ppo_halfcheetah.yaml), as CleanRL's continuous PPO.
    normalize_obs: bool = False
    obs_clip: float = 10.0
    # Divide rewards by the running std of the discounted return (gamma), clipped to
    # +-reward_clip. What PPO learns from only: episode returns and scores stay raw.
    scale_rewards: bool = False
    reward_clip: float = 10.0
    # Orthogonal weights (gain sqrt(2) in hidden layers, 0.01 on the policy's output, 1 on
    # the value's; biases 0), as CleanRL and PureJaxRL, instead of LeCun normal.
    orthogonal_init: bool = False


def minibatch_positions(
    size: int, num_minibatches: int, xp: ModuleType, valid: int | jax.Array | None = None
) -> tuple[Any, Any]:
    """Where each minibatch's samples sit in a pass's order of a batch of ``size``, and
    which of them count, for NumPy (``xp=np``) or JAX (``valid`` may be traced):
    ([num_minibatches, width] positions, [num_minibatches, width] booleans), ``width``
    being ``max(1, size // num_minibatches)``.

    The order's first ``valid`` entries (default: all ``size``) are the batch's samples:
    fewer only in a run's shorter last batch on the fused path, whose arrays keep the full
    shape. Each minibatch takes ``max(1, valid // num_minibatches)`` of them in turn, as
    CleanRL splits a batch (a remainder of fewer than ``num_minibatches`` samples sits the
    pass out); a last batch smaller than ``num_minibatches`` lends each minibatch a sample,
    wrapping around. Positions past that count do not count.
    """
    valid = size if valid is None else valid
    per = xp.maximum(valid // num_minibatches, 1)
    index = xp.arange(max(1, size // num_minibatches))[None, :]
    positions = (xp.arange(num_minibatches)[:, None] * per + index) % valid
    return positions, xp.broadcast_to(index < per, positions.shape)


def batches_in_run(algo: MinibatchSettings, cfg: RunConfig) -> int:
    """Batches (iterations) the run collects, the last one cut to end at ``total_steps``
    (``rollout.rollout_length``): the annealed step size reaches 0 after them."""
    return math.ceil(cfg.total_steps / (algo.num_steps * cfg.num_envs))


def annealed_rate(algo: MinibatchSettings, batch: int | jax.Array, batches: int) -> Any:
    """``anneal_lr``'s step size for batch ``batch`` (from 0; a Python or a traced JAX
    number): ``learning_rate`` decayed linearly to 0 over the run's ``batches``."""
    return algo.learning_rate * (1.0 - batch / batches)


def check_minibatches(algo: MinibatchSettings, cfg: RunConfig) -> None:
    """What PPO's minibatched passes need (PQN's too): a batch that splits into equal
    minibatches and that fits in memory, with every pass's order of it."""
    batch = algo.num_steps * cfg.num_envs
    # Equal minibatches: every transition is used once per epoch, and the fused update
    # has one static minibatch shape.
    if batch % algo.num_minibatches:
        raise ConfigError(
            "algo.num_minibatches",
            algo.num_minibatches,
            f"a divisor of the batch, algo.num_steps * num_envs = {algo.num_steps} * "
            f"{cfg.num_envs} = {batch}",
        )
    # A batch holds num_steps transitions of every env.
    check_memory(cfg, ("algo.num_steps", batch))
    # Every pass's order of the batch is drawn at once: 8-byte indices on torch.
    most = physical_memory() // (8 * batch * agents_at_once(cfg))
    if algo.update_epochs > most:
        raise ConfigError(
            "algo.update_epochs",
            algo.update_epochs,
            f"at most {most:,} for batches of {batch:,} (each pass's order of the batch is "
            "kept: more do not fit in this machine's memory)",
        )


def validate(algo: PPOConfig, cfg: RunConfig) -> None:
    check_ranges(
        algo,
        count=("num_steps", "num_minibatches"),
        passes=("update_epochs",),
        unit=("gamma", "gae_lambda"),
        positive=("learning_rate", "clip_coef", "obs_clip", "reward_clip"),
        off_at_zero=("ent_coef", "max_grad_norm"),
        non_negative=("vf_coef",),
        finite=("initial_log_std",),
    )
    check_hidden_sizes(algo)
    check_network(algo, cfg)
    # Categorical observations are one-hot encoded: a normalised cell code is no class.
    tabular = TASKS.get(cfg.task.name).tabular
    if algo.normalize_obs and tabular is not None and tabular.categorical(cfg.task):
        raise ConfigError(
            "algo.normalize_obs",
            algo.normalize_obs,
            f"false on {cfg.task.name}, whose observations are categorical (one-hot encoded)",
        )
    check_minibatches(algo, cfg)
    check_network_memory(cfg)


SPEC = AlgoSpec(
    name="ppo",
    schema=PPOConfig,
    action_kinds=("discrete", "continuous"),
    learners={
        "torch": "rlspeed.core.algos.ppo.torch:TorchLearner",
        "flax": "rlspeed.core.algos.ppo.flax:FlaxLearner",
    },
    fused="rlspeed.core.algos.ppo.flax:make_train",
    validate=validate,
    tasks=("doors", "cartpole", "pendulum", "halfcheetah", "gym", "gymnax", "playground", "probe"),
)
