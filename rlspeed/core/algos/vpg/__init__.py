"""VPG (vanilla policy gradient) as SpinningUp teaches it: REINFORCE with a learned value
baseline and GAE(lambda) advantages.

Each batch is ``num_steps`` steps of every env, with GAE advantages and value targets from
the on-policy rollouts (``rlspeed/core/algos/rollout.py``). Per batch the policy takes ONE
gradient step on ``-mean(logp * normalised advantage)`` (minus an optional
entropy bonus) and the value function ``value_iterations`` full-batch MSE steps, each with
its own Adam. ``updates`` (``gradient_updates`` in the outputs) counts gradient steps:
``1 + value_iterations`` per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from rlspeed.core.algos import (
    AlgoSpec,
    check_hidden_sizes,
    check_memory,
    check_network,
    check_network_memory,
    check_ranges,
)

if TYPE_CHECKING:
    from rlspeed.config import RunConfig


@dataclass(frozen=True)
class VPGConfig:
    name: str = "vpg"
    # Inputs of the fused program, not constants in it (``rlspeed.core.algos.loops.fused_training.
    # traced_values``): runs differing only in these share one compiled program.
    TRACED: ClassVar[tuple[str, ...]] = ("policy_lr", "value_lr", "gamma", "gae_lambda", "ent_coef")
    # Steps per env in one batch (batch = num_steps * num_envs).
    num_steps: int = 32
    gamma: float = 0.99
    gae_lambda: float = 0.97
    policy_lr: float = 3e-3
    value_lr: float = 1e-3
    # Full-batch value-function gradient steps per batch.
    value_iterations: int = 20
    # Entropy bonus coefficient in the policy loss (0: none).
    ent_coef: float = 0.0
    # Global gradient-norm clipping of each network's step (0: no clipping). Neutral on
    # CartPole; on Doors, 2 of 8 seeds collapsed late without it.
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    # Gaussian policies (continuous actions): the initial state-independent log std
    # (0: std 1, wide exploration within the usual [-1, 1] or [-2, 2] action bounds).
    initial_log_std: float = 0.0
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    # auto (a conv torso before the hidden layers for image observations, as MinAtar's),
    # mlp or cnn: NETWORKS in rlspeed/core/algos/networks/__init__.py.
    network: str = "auto"


def validate(algo: VPGConfig, cfg: RunConfig) -> None:
    check_ranges(
        algo,
        count=("num_steps",),
        passes=("value_iterations",),
        unit=("gamma", "gae_lambda"),
        positive=("policy_lr", "value_lr"),
        off_at_zero=("ent_coef", "max_grad_norm"),
        finite=("initial_log_std",),
    )
    check_hidden_sizes(algo)
    check_network(algo, cfg)
    # A batch holds num_steps transitions of every env.
    check_memory(cfg, ("algo.num_steps", algo.num_steps * cfg.num_envs))
    check_network_memory(cfg)


SPEC = AlgoSpec(
    name="vpg",
    schema=VPGConfig,
    action_kinds=("discrete", "continuous"),
    learners={
        "torch": "rlspeed.core.algos.vpg.torch:TorchLearner",
        "flax": "rlspeed.core.algos.vpg.flax:FlaxLearner",
    },
    fused="rlspeed.core.algos.vpg.flax:make_train",
    validate=validate,
    tasks=("doors", "cartpole", "pendulum", "halfcheetah", "gym", "gymnax", "playground", "probe"),
)
