"""The tabular Q-learning loop driven from Python, shared by the torch learner (any engine)
and the flax learner on the Gymnasium engines (``flax`` + ``jax-vmap`` is fused instead).

Observations become state indices in NumPy (``np.asarray`` views engine arrays without a
copy); the learner only ever sees int32 state indices. Every env step batch is one update.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlspeed.algos.loops.host import host_training
from rlspeed.algos.schedule import epsilon_at
from rlspeed.context import RunContext, TrainResult
from rlspeed.registry import TASKS


class TabularLearner(Protocol):
    def act(self, states: np.ndarray, step: int, epsilon: float) -> Any:
        """Epsilon-greedy actions (random among tied maxima) at env step ``step``, as
        arrays the engine takes."""

    def greedy(self, states: np.ndarray) -> np.ndarray:
        """Greedy actions (first maximum) as NumPy, for evaluation."""

    def update(
        self,
        states: np.ndarray,
        actions: Any,
        rewards: Any,
        next_states: np.ndarray,
        terminated: Any,
    ) -> dict[str, Any]:
        """One table update from a batch of transitions; metrics as backend scalars."""

    def save(self, path: Path) -> Path: ...


def table_shape(cfg: Any, action_space: Any) -> tuple[int, int]:
    """(states, actions): the shape of the run's Q-table."""
    return TASKS.get(cfg.task.name).tabular.num_states(cfg.task), int(action_space.n)


def train_tabular(
    ctx: RunContext,
    make_learner: Callable[[int, int], TabularLearner],
    checkpoint_name: str,
) -> TrainResult:
    """``make_learner(num_states, n_actions)``: see ``rlspeed.algos.loops``."""
    cfg = ctx.cfg
    tabular = ctx.task.tabular
    assert tabular is not None  # the config check admits only tasks with a tabular state
    engine = ctx.make_engine()
    learner = make_learner(*table_shape(cfg, engine.single_action_space))

    def states_of(obs: Any) -> np.ndarray:
        return tabular.state_index(cfg.task, np.asarray(obs), np)

    def greedy_policy(obs: np.ndarray) -> np.ndarray:
        return learner.greedy(states_of(obs))

    with host_training(ctx, engine, learner, checkpoint_name) as parts:
        interval, point, check_interrupt = parts
        states, step, updates = point.start(ctx.resume_state(), lambda: states_of(engine.reset()))
        while step < cfg.total_steps:
            epsilon = float(epsilon_at(step, cfg.algo, cfg.total_steps))
            actions = learner.act(states, step, epsilon)
            result = engine.step(actions)
            # The true next state is the final observation where an episode ended.
            interval.add(
                learner.update(
                    states,
                    actions,
                    result.reward,
                    states_of(result.final_obs),
                    result.terminated,
                )
            )
            ctx.monitor.episodes(
                np.asarray(result.terminated) | np.asarray(result.truncated),
                result.episode_return,
                result.episode_length,
            )
            states = states_of(result.obs)
            step, updates = step + engine.num_envs, updates + 1
            interval.log_if_due(step, updates, greedy_policy, {"charts/epsilon": epsilon})
            point.reached(step, updates, states)
            check_interrupt()
    return TrainResult(steps=step, updates=updates)
