"""PQN, the parallelised Q-network (Gallici et al. 2024, "Simplifying Deep Temporal
Difference Learning"): DQN without a replay buffer or a target network, kept stable by
LayerNorm in the Q-network and by learning from many envs at once.

Each batch is ``num_steps`` steps of every env, acted epsilon-greedily (epsilon decays
linearly from ``start_e`` to ``end_e`` over ``exploration_fraction`` of the run; a rollout
explores at the rate of the env step it starts at). Its targets are Q(lambda) returns,
computed backward over the rollout:
``G_t = r_t + gamma * ((1 - lambda) * max_a Q(s_t+1, a) + lambda * G_t+1)``, with
``G_t = r_t + gamma * max_a Q(final obs, a)`` where the rollout ends or an episode is
truncated, and ``G_t = r_t`` where it terminates. That is GAE's recursion with the values
``V(s) = max_a Q(s, a)`` (``G = advantage + V``), so the on-policy rollouts
(``rlspeed/core/algos/rollout.py``) compute them. Then PPO's update schedule: per batch,
``update_epochs`` passes over a fresh random order of it in ``num_minibatches``
minibatches, one clipped Adam step each on the squared error of Q(s, a) to its return.
``updates`` counts those steps: ``update_epochs * num_minibatches`` per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from rlspeed.core.algos import (
    AlgoSpec,
    check_hidden_sizes,
    check_network,
    check_network_memory,
    check_ranges,
)
from rlspeed.core.algos.ppo import check_minibatches

if TYPE_CHECKING:
    from rlspeed.config import RunConfig


@dataclass(frozen=True)
class PQNConfig:
    name: str = "pqn"
    # Inputs of the fused program, not constants in it (``rlspeed.core.algos.loops.fused_training.
    # traced_values``): runs differing only in these share one compiled program.
    TRACED: ClassVar[tuple[str, ...]] = (
        "learning_rate",
        "gamma",
        "gae_lambda",
        "start_e",
        "end_e",
        "exploration_fraction",
    )
    # Steps per env in one batch (batch = num_steps * num_envs).
    num_steps: int = 128
    gamma: float = 0.99
    # The lambda of the Q(lambda) returns (CleanRL's q_lambda); named as the rollouts'
    # GAE recursion, which computes them, reads it.
    gae_lambda: float = 0.65
    # Adam's step size (eps 1e-5, as PPO's).
    learning_rate: float = 2.5e-4
    # Decay the step size linearly from learning_rate to 0 over the run's batches.
    anneal_lr: bool = True
    # Passes over each batch; each pass a fresh random order.
    update_epochs: int = 4
    # Minibatches per pass, one gradient step each; must divide num_steps * num_envs.
    num_minibatches: int = 4
    # Global gradient-norm clipping (0: no clipping).
    max_grad_norm: float = 10.0
    start_e: float = 1.0
    end_e: float = 0.05
    # Fraction of total_steps over which epsilon decays linearly from start_e to end_e.
    exploration_fraction: float = 0.5
    # Each hidden layer is followed by a LayerNorm, then a ReLU.
    hidden_sizes: list[int] = field(default_factory=lambda: [120, 84])
    # auto (a conv torso before the hidden layers for image observations, as MinAtar's),
    # mlp or cnn: NETWORKS in rlspeed/core/algos/networks/__init__.py.
    network: str = "auto"


def validate(algo: PQNConfig, cfg: RunConfig) -> None:
    check_ranges(
        algo,
        count=("num_steps", "num_minibatches"),
        passes=("update_epochs",),
        unit=("gamma", "gae_lambda", "start_e", "end_e", "exploration_fraction"),
        positive=("learning_rate",),
        off_at_zero=("max_grad_norm",),
    )
    check_hidden_sizes(algo)
    check_network(algo, cfg)
    check_minibatches(algo, cfg)
    check_network_memory(cfg)


SPEC = AlgoSpec(
    name="pqn",
    schema=PQNConfig,
    action_kinds=("discrete",),
    learners={
        "torch": "rlspeed.core.algos.pqn.torch:TorchLearner",
        "flax": "rlspeed.core.algos.pqn.flax:FlaxLearner",
    },
    fused="rlspeed.core.algos.pqn.flax:make_train",
    validate=validate,
)
