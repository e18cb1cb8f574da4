"""The off-policy training loop driven from Python, shared by DQN and TD3 on every
backend and engine (the fused ``flax`` + ``jax-vmap`` path has its own, in JAX).

A backend supplies a learner (its networks, acting and updates); this loop does the
rest as CleanRL does: act, step, store, one gradient update every ``train_frequency``
env steps after ``learning_starts``, log every ``log_every`` env steps. Step counts are
env steps, whatever ``num_envs`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlspeed.algos.loops.host import host_training
from rlspeed.algos.replay import Batch, ReplayBuffer
from rlspeed.algos.schedule import multiples_between
from rlspeed.context import RunContext, TrainResult
from rlspeed.seeding import Stream, numpy_rng


class OffPolicyLearner(Protocol):
    def act(self, obs: Any, step: int) -> Any:
        """Exploratory actions at env step ``step`` for a batch of observations
        (engine-native arrays in, arrays the engine takes out)."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions as NumPy, for evaluation."""

    def update(self, batch: Batch[np.ndarray]) -> dict[str, Any]:
        """One gradient step; its metrics as backend scalars (averaged per log interval)."""

    def after_env_steps(self, prev_step: int, step: int) -> dict[str, float]:
        """Bookkeeping once the env steps ``prev_step`` -> ``step`` are stored and learned
        from (e.g. a periodic target-network sync); returns schedule metrics to log."""

    def save(self, path: Path) -> Path: ...


def train_off_policy(
    ctx: RunContext,
    make_learner: Callable[[Any, Any], OffPolicyLearner],
    checkpoint_name: str,
) -> TrainResult:
    """``make_learner(observation_space, action_space)``: see ``rlspeed.algos.loops``."""
    cfg, algo = ctx.cfg, ctx.cfg.algo
    engine = ctx.make_engine()
    learner = make_learner(engine.single_observation_space, engine.single_action_space)
    buffer = ReplayBuffer(
        algo.buffer_size,
        engine.single_observation_space,
        engine.single_action_space,
        numpy_rng(ctx.seed, Stream.REPLAY),
        engine.num_envs,
        cfg.task.max_steps,
    )
    with host_training(ctx, engine, learner, checkpoint_name, buffer=buffer) as parts:
        interval, point, check_interrupt = parts
        obs, step, updates = point.start(ctx.resume_state(), engine.reset)
        while step < cfg.total_steps:
            actions = learner.act(obs, step)
            result = engine.step(actions)
            buffer.add(
                obs,
                result.final_obs,
                actions,
                result.reward,
                result.terminated,
                result.truncated,
            )
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
                interval.add(learner.update(buffer.sample(algo.batch_size)))
                updates += 1
            schedule = learner.after_env_steps(prev, step)
            interval.log_if_due(step, updates, learner.greedy, schedule)
            point.reached(step, updates, obs)
            check_interrupt()
    return TrainResult(steps=step, updates=updates)
