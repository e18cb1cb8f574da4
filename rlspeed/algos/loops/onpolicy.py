"""The on-policy training loop driven from Python (VPG, PPO), for the torch learners on every
engine and the flax learners on the Gymnasium engines (``flax`` + ``jax-vmap`` runs the same
steps fused: ``jax_onpolicy.py``).

An on-policy algorithm's config has ``num_steps``, ``gamma`` and ``gae_lambda``. Each
iteration collects ``num_steps`` steps of every env into NumPy arrays, computes GAE
advantages and their value targets on the host, and hands the flattened batch to the
learner, whose ``update`` does however many gradient steps the algorithm takes per batch
(``updates_per_batch``). It logs every ``log_every`` env steps. The run's last rollout is
cut short to end at ``total_steps`` (``rollout_length``), so the run trains exactly the
steps it was given when ``total_steps`` is a multiple of ``num_envs``.

The advantages come from GAE, bootstrapped with V(final observation) where an episode was
truncated by the time limit and with 0 where it terminated; the value targets are
``advantage + value``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from rlspeed.algos.loops.host import host_training
from rlspeed.context import RunContext, TrainResult


class RolloutBatch(NamedTuple):
    """One batch, flattened over steps and envs (NumPy here, JAX arrays on the fused path)."""

    obs: Any
    actions: Any  # as sampled (continuous ones unclipped, so their log-prob is exact)
    log_probs: Any  # of the actions, under the policy that sampled them
    values: Any  # V(obs) under the value function of the rollout
    advantages: Any  # GAE, not yet normalised
    returns: Any  # value targets: advantages + values


def advantage_terms(
    rewards: Any,
    values: Any,
    next_values: Any,
    terminated: Any,
    dones: Any,
    gamma: float,
    lam: float,
) -> tuple[Any, Any]:
    """TD errors and per-step decays of GAE, for NumPy or JAX arrays of shape [T, N].

    ``next_values`` is V(final observation) of every step: the next state's value where the
    episode goes on, the bootstrap where it was truncated; a termination zeroes it. The
    decay cuts the sum at every episode end, terminated or truncated.
    """
    deltas = rewards + gamma * (1.0 - terminated.astype(rewards.dtype)) * next_values - values
    decays = gamma * lam * (1.0 - dones.astype(rewards.dtype))
    return deltas, decays


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """GAE(gamma, lambda) advantages [T, N] in NumPy (the fused path runs the same recursion
    as a reverse ``lax.scan``: ``jax_onpolicy.gae_scan``)."""
    deltas, decays = advantage_terms(rewards, values, next_values, terminated, dones, gamma, lam)
    advantages = np.zeros_like(deltas)
    next_advantage = np.zeros_like(advantages[0])
    for t in reversed(range(len(deltas))):
        next_advantage = deltas[t] + decays[t] * next_advantage
        advantages[t] = next_advantage
    return advantages


def rollout_length(steps_left: Any, num_envs: int, horizon: int, xp: Any = np) -> Any:
    """Steps per env of the next rollout, for ints or traced JAX ints (``xp=jnp``):
    ``horizon``, except in the run's last batch, which takes just enough to reach
    ``total_steps`` (``steps_left`` more env steps)."""
    return xp.minimum(horizon, -(-steps_left // num_envs))


class OnPolicyLearner(Protocol):
    # Gradient steps one ``update`` takes (``gradient_updates`` counts them).
    updates_per_batch: int

    def act(self, obs: Any) -> tuple[Any, Any, Any]:
        """Sampled actions for a batch of observations: (as sampled, as sent to the env,
        their log-probabilities)."""

    def values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) as NumPy."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions as NumPy, for evaluation."""

    def update(self, batch: RolloutBatch) -> dict[str, Any]:
        """The algorithm's gradient steps on one batch; metrics as backend scalars.
        The batch's arrays are overwritten by the next rollout: done with them by the time
        the next ``act`` returns (a jitted update is: ``act`` waits for its parameters)."""

    def save(self, path: Path) -> Path: ...


def train_on_policy(
    ctx: RunContext,
    make_learner: Callable[[Any, Any], OnPolicyLearner],
    checkpoint_name: str,
) -> TrainResult:
    """``make_learner(observation_space, action_space)``: see ``rlspeed.algos.loops``."""
    cfg, algo = ctx.cfg, ctx.cfg.algo
    engine = ctx.make_engine()
    learner = make_learner(engine.single_observation_space, engine.single_action_space)
    n, horizon = engine.num_envs, algo.num_steps
    obs_space, action_space = engine.single_observation_space, engine.single_action_space
    obs_buf = np.zeros((horizon, n, *obs_space.shape), dtype=obs_space.dtype)
    final_obs_buf = np.zeros_like(obs_buf)
    action_dtype = np.float32 if action_space.shape else np.int64
    actions_buf = np.zeros((horizon, n, *action_space.shape), dtype=action_dtype)
    log_probs, rewards, terminated, dones = (
        np.zeros((horizon, n), dtype=np.float32) for _ in range(4)
    )

    # The rollout arrays are refilled every iteration: nothing in them carries over.
    with host_training(ctx, engine, learner, checkpoint_name) as parts:
        interval, point, check_interrupt = parts
        obs, step, updates = point.start(ctx.resume_state(), engine.reset)
        while step < cfg.total_steps:
            length = int(rollout_length(cfg.total_steps - step, n, horizon))
            for t in range(length):
                actions, env_actions, log_prob = learner.act(obs)
                result = engine.step(env_actions)
                obs_buf[t] = np.asarray(obs)
                actions_buf[t] = np.asarray(actions)
                log_probs[t] = np.asarray(log_prob)
                rewards[t] = np.asarray(result.reward)
                terminated[t] = np.asarray(result.terminated)
                dones[t] = np.asarray(result.terminated) | np.asarray(result.truncated)
                final_obs_buf[t] = np.asarray(result.final_obs)
                ctx.monitor.episodes(dones[t] > 0, result.episode_return, result.episode_length)
                obs = result.obs
            step += length * n

            flat_obs = obs_buf[:length].reshape(length * n, *obs_space.shape)
            values = learner.values(flat_obs).reshape(length, n)
            next_values = learner.values(final_obs_buf[:length].reshape(flat_obs.shape))
            next_values = next_values.reshape(length, n)
            advantages = gae(
                rewards[:length],
                values,
                next_values,
                terminated[:length],
                dones[:length],
                algo.gamma,
                algo.gae_lambda,
            )
            batch = RolloutBatch(
                flat_obs,
                actions_buf[:length].reshape(length * n, *action_space.shape),
                log_probs[:length].reshape(-1),
                values.reshape(-1),
                advantages.reshape(-1),
                (advantages + values).reshape(-1),
            )
            interval.add(learner.update(batch))
            updates += learner.updates_per_batch
            interval.log_if_due(step, updates, learner.greedy)
            point.reached(step, updates, obs)
            check_interrupt()
    return TrainResult(steps=step, updates=updates)
