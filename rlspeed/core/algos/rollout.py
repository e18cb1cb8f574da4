"""On-policy rollouts and their GAE advantages, on the host (NumPy): what VPG and PPO share
on every engine driven from Python (their JAX twin, for flax: ``rollout_jax.py``).

A rollout is ``num_steps`` steps of every env (``Rollout.collect``); the run's last one is
cut short to end at ``total_steps`` (``rollout_length``), so a run trains exactly the steps
it was given when ``total_steps`` is a multiple of ``num_envs``. Its advantages come from
GAE, bootstrapped with V(final observation) where an episode was truncated by the time
limit and with 0 where it terminated; the value targets are ``advantage + value``
(``Rollout.batch``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from rlspeed.core.algos.loops.host import EpisodeSink, Iteration
from rlspeed.core.algos.normalization import HostNormalization, NormSettings
from rlspeed.core.engines import Engine

if TYPE_CHECKING:
    from types import ModuleType

    import jax
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AnyArray, XpArray, XpArrayT


class RolloutBatch(NamedTuple):
    """One batch, flattened over steps and envs (NumPy here, JAX arrays on the fused path)."""

    obs: Any
    actions: Any  # as sampled (continuous ones unclipped, so their log-prob is exact)
    log_probs: Any  # of the actions, under the policy that sampled them
    values: Any  # V(obs) under the value function of the rollout
    advantages: Any  # GAE, not yet normalised
    returns: Any  # value targets: advantages + values


def rollout_length(
    steps_left: int | jax.Array, num_envs: int, horizon: int, xp: ModuleType = np
) -> Any:
    """Steps per env of the next rollout, for ints or traced JAX ints (``xp=jnp``):
    ``horizon``, except in the run's last batch, which takes just enough to reach
    ``total_steps`` (``steps_left`` more env steps)."""
    return xp.minimum(horizon, -(-steps_left // num_envs))


def advantage_terms(
    rewards: XpArrayT,
    values: XpArrayT,
    next_values: XpArrayT,
    terminated: XpArrayT,
    dones: XpArrayT,
    gamma: float,
    lam: float,
) -> tuple[XpArrayT, XpArrayT]:
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
    as a reverse ``lax.scan``: ``rollout_jax.gae_scan``)."""
    deltas, decays = advantage_terms(rewards, values, next_values, terminated, dones, gamma, lam)
    advantages: np.ndarray = np.zeros_like(deltas)
    next_advantage = np.zeros_like(advantages[0])
    for t in reversed(range(len(deltas))):
        next_advantage = deltas[t] + decays[t] * next_advantage
        advantages[t] = next_advantage
    return advantages


# A policy acting on a batch of observations: (actions as sampled, as sent to the env, their
# log-probabilities), arrays of the learner's library.
Act = Callable[["XpArray"], tuple["AnyArray", "AnyArray", "AnyArray"]]


class Rollout:
    """The arrays of one rollout of ``num_envs`` envs, at most ``horizon`` steps each:
    refilled every iteration, so nothing in them carries over (a resume does not need them)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int,
        horizon: int,
    ) -> None:
        # Never None: gymnasium types every space's shape as optional, for the spaces
        # without one (Dict, Tuple), which no algorithm takes.
        self.obs_shape, self.action_shape = (
            cast("tuple[int, ...]", space.shape) for space in (obs_space, action_space)
        )
        self.obs = np.zeros((horizon, num_envs, *self.obs_shape), dtype=obs_space.dtype)
        self.final_obs = np.zeros_like(self.obs)
        action_dtype = np.float32 if action_space.shape else np.int64
        self.actions = np.zeros((horizon, num_envs, *self.action_shape), dtype=action_dtype)
        self.log_probs, self.rewards, self.terminated, self.dones = (
            np.zeros((horizon, num_envs), dtype=np.float32) for _ in range(4)
        )

    def collect(
        self,
        engine: Engine,
        act: Act,
        obs: XpArray,
        length: int,
        episodes: EpisodeSink,
        norm: HostNormalization | None = None,
    ) -> Any:
        """Step every env ``length`` times with ``act``, from ``obs``; finished episodes go
        to ``episodes``. Returns the envs' latest observations (raw). ``norm``: the
        observations acted on and stored are normalised, the stored rewards scaled."""
        for t in range(length):
            seen = obs if norm is None else norm.observe(obs)
            actions, env_actions, log_prob = act(seen)
            result = engine.step(env_actions)
            self.obs[t] = np.asarray(seen)
            self.actions[t] = np.asarray(actions)
            self.log_probs[t] = np.asarray(log_prob)
            self.terminated[t] = np.asarray(result.terminated)
            self.dones[t] = np.asarray(result.terminated) | np.asarray(result.truncated)
            if norm is None:
                self.rewards[t] = np.asarray(result.reward)
                self.final_obs[t] = np.asarray(result.final_obs)
            else:
                self.rewards[t] = norm.rewards(result.reward, self.dones[t] > 0)
                self.final_obs[t] = norm.normalize(result.final_obs)
            episodes.episodes(self.dones[t] > 0, result.episode_return, result.episode_length)
            obs = result.obs
        return obs

    def batch(
        self, length: int, values: Callable[[np.ndarray], np.ndarray], gamma: float, lam: float
    ) -> RolloutBatch:
        """The first ``length`` steps as one flat batch, with GAE(``gamma``, ``lam``)
        advantages and value targets from the value function ``values`` (NumPy in and out)."""
        n = self.obs.shape[1]
        flat_obs = self.obs[:length].reshape(length * n, *self.obs_shape)
        step_values = values(flat_obs).reshape(length, n)
        next_values = values(self.final_obs[:length].reshape(flat_obs.shape)).reshape(length, n)
        advantages = gae(
            self.rewards[:length],
            step_values,
            next_values,
            self.terminated[:length],
            self.dones[:length],
            gamma,
            lam,
        )
        return RolloutBatch(
            flat_obs,
            self.actions[:length].reshape(length * n, *self.action_shape),
            self.log_probs[:length].reshape(-1),
            step_values.reshape(-1),
            advantages.reshape(-1),
            (advantages + step_values).reshape(-1),
        )


class RolloutLearner:
    """What VPG's and PPO's learners share on the host, on either backend: the iteration
    ``HostTraining`` runs. It collects a rollout of every env (``Rollout.collect``; the run's
    last one cut to end at ``total_steps``), computes its GAE advantages and value targets
    (``Rollout.batch``), then makes the algorithm's update on it.

    A learner calls ``init_rollout`` and has, from its algorithm's file, ``act``, ``values``
    and ``update`` (its loss and gradient steps, ``updates_per_batch`` of them). With
    ``norm`` settings it acts on normalised observations and learns from scaled rewards
    (``rlspeed.core.algos.normalization``); its greedy actions then go through ``seen``.

    A learner's ``state_dict`` (its resume state) holds ``rollout_state()``, this class's
    part; the rollout arrays are refilled every iteration, so none of them is in it."""

    algo: Any
    updates_per_batch: int
    act: Act
    values: Callable[[np.ndarray], np.ndarray]
    update: Callable[[RolloutBatch], dict[str, Any]]

    def init_rollout(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        cfg: RunConfig,
        norm: NormSettings | None = None,
    ) -> None:
        self.total_steps, self.num_envs = cfg.total_steps, cfg.num_envs
        self.rollout = Rollout(obs_space, action_space, cfg.num_envs, cfg.algo.num_steps)
        # Saved with the learner's state (resume: ``rollout_state``); None where off.
        self.normalization = (
            None
            if norm is None
            else HostNormalization(norm, self.rollout.obs_shape, cfg.num_envs, cfg.algo.gamma)
        )

    def rollout_state(self) -> dict[str, Any]:
        """The normalisation statistics (where on), after the run's step counts: these two
        are its config's, written because resume files have always held them (a resumed
        run's config is the saved one's: ``load_rollout_state`` does not read them)."""
        state: dict[str, Any] = {"total_steps": self.total_steps, "num_envs": self.num_envs}
        if self.normalization is not None:
            state["normalization"] = self.normalization.state_dict()
        return state

    def load_rollout_state(self, state: dict[str, Any]) -> None:
        if self.normalization is not None:
            self.normalization.load_state_dict(state["normalization"])

    def seen(self, obs: XpArray) -> Any:
        """Observations as the policy sees them: normalised, not counted."""
        return obs if self.normalization is None else self.normalization.normalize(obs)

    def iteration(
        self, engine: Engine, obs: XpArray, step: int, episodes: EpisodeSink
    ) -> Iteration:
        """Collect a rollout from env step ``step``, compute its advantages, update on it."""
        algo, n = self.algo, self.num_envs
        length = int(rollout_length(self.total_steps - step, n, algo.num_steps))
        obs = self.rollout.collect(engine, self.act, obs, length, episodes, self.normalization)
        batch = self.rollout.batch(length, self.values, algo.gamma, algo.gae_lambda)
        return Iteration(obs, length * n, self.updates_per_batch, [self.update(batch)])
