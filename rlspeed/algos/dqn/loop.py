"""The DQN training loop driven from Python, shared by every backend on any engine.

A backend supplies a ``Learner`` (its network, act and update); this loop does the
rest exactly as CleanRL's DQN: act epsilon-greedily, step, store, update every
``train_frequency`` env steps after ``learning_starts``, sync the target network every
``target_network_frequency`` env steps, log every ``log_every`` env steps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlspeed.algos.replay import Batch, ReplayBuffer
from rlspeed.algos.schedule import linear_schedule, multiples_between
from rlspeed.run import RunContext, TrainResult


class Learner(Protocol):
    def act(self, obs: Any, epsilon: float) -> Any:
        """Epsilon-greedy actions for a batch of observations (engine-native arrays)."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions as NumPy, for evaluation."""

    def update(self, batch: Batch) -> tuple[Any, Any]:
        """One gradient step; returns (TD loss, mean Q) as backend scalars."""

    def sync_target(self) -> None: ...

    def save(self, path: Path) -> Path: ...


def epsilon_at(step: Any, algo: Any, total_steps: int, xp: Any = np) -> Any:
    duration = algo.exploration_fraction * total_steps
    return linear_schedule(step, algo.start_e, algo.end_e, duration, xp)


def train_host(
    ctx: RunContext, make_learner: Callable[[Any, Any], Learner], checkpoint_name: str
) -> TrainResult:
    """``make_learner(observation_space, action_space)`` runs after the engine exists, so
    AsyncVectorEnv forks its workers before the backend starts threads of its own."""
    cfg, algo = ctx.cfg, ctx.cfg.algo
    engine = ctx.make_engine()
    learner = make_learner(engine.single_observation_space, engine.single_action_space)
    ctx.save_checkpoint = lambda: learner.save(ctx.out_dir / checkpoint_name)
    buffer = ReplayBuffer(
        algo.buffer_size, engine.single_observation_space, engine.single_action_space, cfg.seed
    )
    step = updates = 0
    next_log = cfg.log_every
    losses: list[Any] = []
    q_values: list[Any] = []
    try:
        obs = engine.reset()
        while step < cfg.total_steps:
            epsilon = float(epsilon_at(step, algo, cfg.total_steps))
            actions = learner.act(obs, epsilon)
            result = engine.step(actions)
            buffer.add(obs, result.final_obs, actions, result.reward, result.terminated)
            ctx.monitor.episodes(
                np.asarray(result.terminated) | np.asarray(result.truncated),
                result.episode_return,
                result.episode_length,
            )
            obs = result.obs
            prev, step = step, step + engine.num_envs
            for _ in range(
                int(multiples_between(prev, step, algo.train_frequency, algo.learning_starts))
            ):
                loss, q = learner.update(buffer.sample(algo.batch_size))
                losses.append(loss)
                q_values.append(q)
                updates += 1
            if multiples_between(prev, step, algo.target_network_frequency, algo.learning_starts):
                learner.sync_target()
            if step >= next_log or step >= cfg.total_steps:
                metrics = {"charts/epsilon": epsilon}
                if losses:
                    metrics["losses/td_loss"] = float(np.mean([float(x) for x in losses]))
                    metrics["losses/q_values"] = float(np.mean([float(x) for x in q_values]))
                    losses, q_values = [], []
                ctx.monitor.log(step, updates, metrics, learner.greedy)
                next_log += cfg.log_every
    finally:
        engine.close()
    return TrainResult(steps=step, updates=updates)
