"""Tabular Q-learning (Watkins 1989) on tasks with a finite state index (``TaskSpec.tabular``).

A table ``Q[num_states, n_actions]`` starts at zero. Acting is epsilon-greedy with random
tie-breaking, so a fresh table picks uniformly instead of always taking action 0. All the
transitions of one env step batch update the table together: the TD errors of the
transitions that hit the same ``(s, a)`` are averaged, ``Q[s, a] += alpha * mean(td)``, so
many envs starting in the same cell cannot overshoot. One such batch update counts as one
"update" (``gradient_updates`` = env step batches). Step counts are env steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlspeed.algos import AlgoSpec, check_memory, check_ranges
from rlspeed.errors import ConfigError
from rlspeed.registry import TASKS


@dataclass
class QLearnConfig:
    name: str = "qlearn"
    # Step size of the table update.
    alpha: float = 0.5
    # Doors' reward telescopes (every path to the goal earns the same total), so only
    # discounting rewards a short path; GridWorld's single goal reward needs it too.
    gamma: float = 0.9
    start_e: float = 1.0
    end_e: float = 0.05
    # Fraction of total_steps over which epsilon decays linearly from start_e to end_e.
    exploration_fraction: float = 0.5


def validate(algo: QLearnConfig, cfg: Any) -> None:
    check_ranges(algo, step=("alpha",), unit=("gamma", "start_e", "end_e", "exploration_fraction"))
    if TASKS.get(cfg.task.name).tabular is None:
        tabular = sorted(task.name for task in TASKS if task.tabular is not None)
        raise ConfigError(
            "task", cfg.task.name, f"a task with a tabular state: {', '.join(tabular)}"
        )
    check_memory(cfg)


SPEC = AlgoSpec(
    name="qlearn",
    schema=QLearnConfig,
    action_kinds=("discrete",),
    loop="tabular",
    learners={
        "torch": "rlspeed.algos.qlearn.torch:TorchQTable",
        "flax": "rlspeed.algos.qlearn.flax:FlaxQTable",
    },
    fused="rlspeed.algos.qlearn.flax:make_train",
    validate=validate,
)
