"""DQN (Mnih et al. 2015) as CleanRL users know it: replay buffer, target network,
linear epsilon schedule. All step counts are environment steps, whatever ``num_envs``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from rlspeed.core.algos import (
    AlgoSpec,
    check_hidden_sizes,
    check_network,
    check_network_memory,
    check_ranges,
)
from rlspeed.core.algos.schedule import epsilon_at, multiples_between, polyak_weight, updates_in_run
from rlspeed.errors import ConfigError

if TYPE_CHECKING:
    from rlspeed.config import RunConfig
    from rlspeed.core import XpArray


@dataclass(frozen=True)
class DQNConfig:
    name: str = "dqn"
    # Inputs of the fused program, not constants in it (``rlspeed.core.algos.loops.fused_training.
    # traced_values``): runs differing only in these share one compiled program.
    TRACED: ClassVar[tuple[str, ...]] = (
        "learning_rate",
        "gamma",
        "tau",
        "start_e",
        "end_e",
        "exploration_fraction",
    )
    learning_rate: float = 3e-4
    # Decay the learning rate linearly to 0 over the run's updates: holds on to a learned
    # policy at the end (DQN on CartPole otherwise drifts off after solving it).
    anneal_lr: bool = False
    optimizer: str = "adam"
    buffer_size: int = 50_000
    batch_size: int = 128
    # Doors' reward telescopes (every path to the goal earns the same total), so only
    # discounting rewards a short path: at 0.99 stalling beside the goal costs 1%, less
    # than the approximation error, and greedy agents park there; 0.9 solves it.
    gamma: float = 0.9
    # Target update: 1.0 copies the online network, < 1 is Polyak averaging.
    tau: float = 1.0
    target_network_frequency: int = 1_000
    # Env steps per gradient update (4 -> one update every 4 env steps).
    train_frequency: int = 4
    learning_starts: int = 5_000
    start_e: float = 1.0
    end_e: float = 0.05
    # Fraction of total_steps over which epsilon decays linearly from start_e to end_e.
    exploration_fraction: float = 0.3
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 128])
    # auto (a conv torso before the hidden layers for image observations, as MinAtar's),
    # mlp or cnn: NETWORKS in rlspeed/core/algos/networks/__init__.py.
    network: str = "auto"


OPTIMIZERS = ("adam", "sgd")


def total_updates(algo: DQNConfig, total_steps: int, num_envs: int) -> int:
    """Gradient updates a DQN run does (past ``total_steps`` when that is not a multiple of
    ``num_envs``: the loop takes whole iterations)."""
    return updates_in_run(total_steps, num_envs, algo.train_frequency, algo.learning_starts)


def learning_rate_at(
    update: int | XpArray, algo: DQNConfig, total_steps: int, num_envs: int
) -> Any:
    """Learning rate of gradient update number ``update`` (from 0); NumPy or JAX scalars.
    Annealed, the last update's rate is ``learning_rate / total_updates`` (never below 0)."""
    if not algo.anneal_lr:
        return algo.learning_rate
    return algo.learning_rate * (1.0 - update / max(total_updates(algo, total_steps, num_envs), 1))


class DQNSchedule:
    """Exploration and target syncs by env step, the same for every backend's learner
    (which sets ``algo``, ``total_steps``, ``num_envs`` and defines ``sync_target``).
    ``after_env_steps`` is what ``rlspeed.core.algos.replay.ReplayLearner.iteration`` does after
    an iteration's updates."""

    algo: DQNConfig
    total_steps: int
    num_envs: int

    def epsilon(self, step: int) -> float:
        return float(epsilon_at(step, self.algo, self.total_steps))

    def sync_target(self, weight: float) -> None:
        """``target += weight * (online - target)``."""
        raise NotImplementedError

    def after_env_steps(self, prev_step: int, step: int) -> dict[str, float]:
        algo = self.algo
        crossings = multiples_between(
            prev_step, step, algo.target_network_frequency, algo.learning_starts
        )
        if crossings:
            self.sync_target(float(polyak_weight(algo.tau, int(crossings))))
        return {"charts/epsilon": self.epsilon(step)}


def validate(algo: DQNConfig, cfg: RunConfig) -> None:
    if algo.optimizer not in OPTIMIZERS:
        raise ConfigError("algo.optimizer", algo.optimizer, f"one of {', '.join(OPTIMIZERS)}")
    check_ranges(
        algo,
        count=("target_network_frequency",),
        unit=("gamma", "start_e", "end_e", "exploration_fraction"),
        step=("tau",),
        positive=("learning_rate",),
    )
    check_hidden_sizes(algo)
    check_network(algo, cfg)
    # Imported here: the replay module loads NumPy, which a config error is printed without.
    from rlspeed.core.algos.replay import check_replay

    check_replay(algo, cfg)
    check_network_memory(cfg)


SPEC = AlgoSpec(
    name="dqn",
    schema=DQNConfig,
    action_kinds=("discrete",),
    learners={
        "torch": "rlspeed.core.algos.dqn.torch:TorchLearner",
        "flax": "rlspeed.core.algos.dqn.flax:FlaxLearner",
    },
    fused="rlspeed.core.algos.dqn.flax:make_train",
    validate=validate,
)
