"""The on-policy training loop driven from Python, shared by the torch and flax VPG learners
on every engine it drives (the fused ``flax`` + ``jax-vmap`` path has its own, in JAX).

Collect ``num_steps`` steps of every env into NumPy arrays, compute GAE advantages and
rewards-to-go on the host, hand the flattened batch to the learner for one update, log
every ``log_every`` env steps. Training runs whole batches until ``total_steps`` is reached.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from rlspeed.algos.vpg import gae
from rlspeed.checkpoint import ResumePoint, deferred_interrupts
from rlspeed.monitor import IntervalMetrics
from rlspeed.run import RunContext, TrainResult


class RolloutBatch(NamedTuple):
    """One batch, flattened over steps and envs (NumPy here, JAX arrays on the fused path)."""

    obs: Any
    actions: Any  # as sampled (continuous ones unclipped, so their log-prob is exact)
    advantages: Any  # GAE, not yet normalised
    returns: Any  # value targets: advantages + values


class OnPolicyLearner(Protocol):
    def act(self, obs: Any) -> tuple[Any, Any]:
        """Sampled actions for a batch of observations: (as sampled, as sent to the env)."""

    def values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) as NumPy."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions as NumPy, for evaluation."""

    def update(self, batch: RolloutBatch) -> dict[str, Any]:
        """One policy step and ``value_iterations`` value steps; metrics as backend scalars.
        The batch's arrays are overwritten by the next rollout: done with them by the time
        the next ``act`` returns (a jitted update is: ``act`` waits for its parameters)."""

    def save(self, path: Path) -> Path: ...


def train_on_policy(
    ctx: RunContext,
    make_learner: Callable[[Any, Any], OnPolicyLearner],
    checkpoint_name: str,
) -> TrainResult:
    """``make_learner(observation_space, action_space)`` runs after the engine exists, so
    AsyncVectorEnv forks its workers before the backend starts threads of its own."""
    cfg, algo = ctx.cfg, ctx.cfg.algo
    engine = ctx.make_engine()
    learner = make_learner(engine.single_observation_space, engine.single_action_space)
    n, horizon = engine.num_envs, algo.num_steps
    obs_space, action_space = engine.single_observation_space, engine.single_action_space
    obs_buf = np.zeros((horizon, n, *obs_space.shape), dtype=obs_space.dtype)
    final_obs_buf = np.zeros_like(obs_buf)
    action_dtype = np.float32 if action_space.shape else np.int64
    actions_buf = np.zeros((horizon, n, *action_space.shape), dtype=action_dtype)
    rewards, terminated, dones = (np.zeros((horizon, n), dtype=np.float32) for _ in range(3))

    interval = IntervalMetrics(ctx.monitor, cfg.log_every, cfg.total_steps)
    # The rollout arrays are refilled every iteration: nothing in them carries over.
    point = ResumePoint(learner=learner, interval=interval, engine=engine)
    ctx.set_checkpoint(checkpoint_name, learner.save, point.state)
    try:
        with deferred_interrupts() as check_interrupt:
            obs, step, updates = point.start(ctx.resume_state(), engine.reset)
            while step < cfg.total_steps:
                for t in range(horizon):
                    actions, env_actions = learner.act(obs)
                    result = engine.step(env_actions)
                    obs_buf[t] = np.asarray(obs)
                    actions_buf[t] = np.asarray(actions)
                    rewards[t] = np.asarray(result.reward)
                    terminated[t] = np.asarray(result.terminated)
                    dones[t] = np.asarray(result.terminated) | np.asarray(result.truncated)
                    final_obs_buf[t] = np.asarray(result.final_obs)
                    ctx.monitor.episodes(dones[t] > 0, result.episode_return, result.episode_length)
                    obs = result.obs
                step += horizon * n

                flat_obs = obs_buf.reshape(horizon * n, *obs_space.shape)
                values = learner.values(flat_obs).reshape(horizon, n)
                next_values = learner.values(final_obs_buf.reshape(flat_obs.shape))
                next_values = next_values.reshape(horizon, n)
                advantages = gae(
                    rewards, values, next_values, terminated, dones, algo.gamma, algo.gae_lambda
                )
                batch = RolloutBatch(
                    flat_obs,
                    actions_buf.reshape(horizon * n, *action_space.shape),
                    advantages.reshape(-1),
                    (advantages + values).reshape(-1),
                )
                interval.add(learner.update(batch))
                updates += 1 + algo.value_iterations
                interval.log_if_due(step, updates, learner.greedy)
                point.reached(step, updates, obs)
                check_interrupt()
    finally:
        point.freeze()
        engine.close()
    return TrainResult(steps=step, updates=updates)
