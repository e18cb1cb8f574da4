"""Tabular Q-learning (Watkins 1989) on tasks with a finite state index (``TaskSpec.tabular``).

A table ``Q[num_states, n_actions]`` starts at zero. Acting is epsilon-greedy with random
tie-breaking, so a fresh table picks uniformly instead of always taking action 0. All the
transitions of one env step batch update the table together: the TD errors of the
transitions that hit the same ``(s, a)`` are averaged, ``Q[s, a] += alpha * mean(td)``, so
many envs starting in the same cell cannot overshoot. One such batch update counts as one
"update" (``gradient_updates`` = env step batches). Step counts are env steps.

Driven from Python (``rlspeed.core.algos.loops.host.HostTraining``), both backends' tables run
``QTableLearner.iteration`` below; ``flax`` + ``jax-vmap`` fuses the same steps into one
program (``rlspeed.core.algos.qlearn.flax.make_train``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlspeed.core.algos import AlgoSpec, agents_at_once, check_memory, check_ranges
from rlspeed.core.algos.schedule import epsilon_at
from rlspeed.errors import ConfigError
from rlspeed.machine import physical_memory
from rlspeed.registry import TASKS

if TYPE_CHECKING:
    import numpy as np
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import XpArray
    from rlspeed.core.algos.loops.host import EpisodeSink, Iteration
    from rlspeed.core.engines import Engine


@dataclass(frozen=True)
class QLearnConfig:
    name: str = "qlearn"
    # Inputs of the fused program, not constants in it (``rlspeed.core.algos.loops.fused_training.
    # traced_values``): runs differing only in these share one compiled program.
    TRACED: ClassVar[tuple[str, ...]] = (
        "alpha",
        "gamma",
        "start_e",
        "end_e",
        "exploration_fraction",
    )
    # Step size of the table update.
    alpha: float = 0.5
    # Doors' reward telescopes (every path to the goal earns the same total), so only
    # discounting rewards a short path; GridWorld's single goal reward needs it too.
    gamma: float = 0.9
    start_e: float = 1.0
    end_e: float = 0.05
    # Fraction of total_steps over which epsilon decays linearly from start_e to end_e.
    exploration_fraction: float = 0.5


def table_shape(cfg: RunConfig, action_space: spaces.Discrete) -> tuple[int, int]:
    """(states, actions): the shape of the run's Q-table."""
    return TASKS.get(cfg.task.name).tabular.num_states(cfg.task), int(action_space.n)


class QTableLearner:
    """What both backends' Q-tables do when driven from Python (``HostTraining``). Between
    iterations they carry the envs' state indices, not their observations (``observe``
    turns observations into indices; a resume file holds the indices). A backend sizes its
    table with ``table_shape`` and defines ``act``, ``update`` and ``greedy_states`` on
    state indices (int32 NumPy arrays)."""

    def __init__(self, cfg: RunConfig) -> None:
        # The run's config, no number of its own: a resume file holds the learner's numbers.
        self.cfg = cfg
        self.tabular = TASKS.get(cfg.task.name).tabular

    def observe(self, obs: XpArray) -> np.ndarray:
        """The state indices of a batch of observations (``np.asarray`` views engine arrays
        without a copy)."""
        import numpy as np  # here: config checks read this module without NumPy

        states: np.ndarray = self.tabular.state_index(self.cfg.task, np.asarray(obs), np)
        return states

    def act(self, states: np.ndarray, step: int, epsilon: float) -> Any:
        """Epsilon-greedy actions (random among tied maxima) at env step ``step``, as
        arrays the engine takes."""
        raise NotImplementedError

    def update(
        self,
        states: np.ndarray,
        actions: Any,
        rewards: Any,
        next_states: np.ndarray,
        terminated: Any,
    ) -> dict[str, Any]:
        """One table update from a batch of transitions; metrics as backend scalars."""
        raise NotImplementedError

    def greedy_states(self, states: np.ndarray) -> np.ndarray:
        """Greedy actions (first maximum) as NumPy."""
        raise NotImplementedError

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions of observations, for evaluation."""
        return self.greedy_states(self.observe(obs))

    def iteration(
        self, engine: Engine, states: np.ndarray, step: int, episodes: EpisodeSink
    ) -> Iteration:
        """One env step of every env from env step ``step``, and the table update from it."""
        import numpy as np

        from rlspeed.core.algos.loops.host import Iteration

        # Collect: act epsilon-greedily on the states, step every env.
        epsilon = float(epsilon_at(step, self.cfg.algo, self.cfg.total_steps))
        actions = self.act(states, step, epsilon)
        result = engine.step(actions)
        # Update: the true next state is the final observation where an episode ended.
        next_states = self.observe(result.final_obs)
        metrics = self.update(states, actions, result.reward, next_states, result.terminated)
        episodes.episodes(
            np.asarray(result.terminated) | np.asarray(result.truncated),
            result.episode_return,
            result.episode_length,
        )
        latest = {"charts/epsilon": epsilon}
        return Iteration(self.observe(result.obs), engine.num_envs, 1, [metrics], latest)


def validate(algo: QLearnConfig, cfg: RunConfig) -> None:
    check_ranges(algo, step=("alpha",), unit=("gamma", "start_e", "end_e", "exploration_fraction"))
    if TASKS.get(cfg.task.name).tabular is None:
        tabular = sorted(task.name for task in TASKS if task.tabular is not None)
        raise ConfigError(
            "task", cfg.task.name, f"a task with a tabular state: {', '.join(tabular)}"
        )
    check_table(cfg)
    check_memory(cfg)


# States are int32 indices on every path.
MAX_STATES = 2**31 - 1
# Tables a Q-learning agent holds at once: its own, an update's count of the batch's hits
# per cell (a table of zeros first), and on flax the updated table before the old is freed.
TABLE_COPIES = 3


def check_table(cfg: RunConfig) -> None:
    """A Q-table that fits: int32 state indices, and memory for every agent's table (a
    float32 per state and action, TABLE_COPIES times; task=gym's spaces can be huge)."""
    tabular = TASKS.get(cfg.task.name).tabular
    states = tabular.num_states(cfg.task)
    actions = tabular.num_actions(cfg.task) if tabular.num_actions is not None else 1
    entries = states * actions * agents_at_once(cfg)
    needed, available = 4 * TABLE_COPIES * entries, physical_memory()
    if states > MAX_STATES or needed > available:
        raise ConfigError(
            "task",
            cfg.task.name,
            f"a task whose Q-table fits: at most {MAX_STATES:,} states and the memory for "
            f"them (it has {states:,} states x {actions:,} actions, {TABLE_COPIES} copies, "
            f"{needed / 2**30:,.1f} GiB or more; this machine has {available / 2**30:,.1f} GiB)",
        )


SPEC = AlgoSpec(
    name="qlearn",
    schema=QLearnConfig,
    action_kinds=("discrete",),
    # A finite state index (``TaskSpec.tabular``).
    observation_kinds=("categorical",),
    learners={
        "torch": "rlspeed.core.algos.qlearn.torch:TorchQTable",
        "flax": "rlspeed.core.algos.qlearn.flax:FlaxQTable",
    },
    fused="rlspeed.core.algos.qlearn.flax:make_train",
    validate=validate,
)
