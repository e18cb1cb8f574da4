"""On-policy rollouts and their GAE advantages in JAX: what VPG and PPO share on flax. An
algorithm writes its pure functions (``OnPolicyFunctions``: act, values, update) and gets
from here both the learner ``HostTraining`` drives on the Gymnasium engines
(``OnPolicyJaxLearner``: host rollouts of ``rollout.py``, jitted functions) and the fused
program of ``backend=flax env=jax-vmap``, in which one ``lax.scan`` iteration is a
``num_steps`` rollout (an inner ``lax.scan``), GAE (a reverse ``lax.scan``) and the
algorithm's update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import jax
import jax.numpy as jnp
import numpy as np

from rlspeed.core.algos.loops.fused import FusedTrainer, per_seed_mean, scan_iterations
from rlspeed.core.algos.loops.jax_learner import JaxLearner
from rlspeed.core.algos.normalization import (
    Moments,
    NormSettings,
    NormState,
    init_state,
    normalize,
    observe,
    scale_rewards,
    standardized,
)
from rlspeed.core.algos.rollout import RolloutBatch, RolloutLearner, advantage_terms, rollout_length
from rlspeed.core.engines import StepResult
from rlspeed.core.envs.vmap import VmapEnv, VmapState
from rlspeed.core.state import tree_from_host, tree_to_host
from rlspeed.seeding import JaxKeys, Stream, jax_key

if TYPE_CHECKING:
    from flax.typing import VariableDict
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, PyTree, XpArray


class OnPolicyFunctions(Protocol):
    """Pure functions of one on-policy configuration. The agent they make is a NamedTuple
    with attributes ``policy_params`` and ``value_params`` (what acting and the values
    take: flax variables, the networks' parameters; PQN's Q-network's with its exploration
    clock) and whatever else it needs."""

    # Gradient steps one ``update`` takes.
    updates_per_batch: int

    def init(self, key: jax.Array) -> PyTree: ...

    def act(
        self, policy_params: PyTree, obs: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sampled actions: (as sampled, as sent to the env, their log-probabilities)."""

    def values(self, value_params: PyTree, obs: jax.Array) -> jax.Array:
        """V(obs) [B]."""

    def greedy(self, policy_params: PyTree, obs: jax.Array) -> jax.Array: ...

    def update(
        self,
        agent: PyTree,
        batch: RolloutBatch,
        key: jax.Array,
        *,
        valid: jax.Array | None = None,
    ) -> tuple[PyTree, dict[str, jax.Array]]:
        """The gradient steps on one batch; ``key`` for its random draws (minibatches).
        ``valid``: only the batch's first ``valid`` samples count (default: all)."""


def sample_weights(size: int, valid: jax.Array | None) -> jax.Array:
    """1.0 for each of a batch's ``size`` samples that counts (its first ``valid``), else 0."""
    if valid is None:
        return jnp.ones(size)
    return (jnp.arange(size) < valid).astype(jnp.float32)


def weighted_mean(x: jax.Array, weights: jax.Array) -> jax.Array:
    """The mean of ``x`` [B] over the samples that count (``weights`` 1.0)."""
    return jnp.sum(x * weights) / jnp.sum(weights)


def normalized(advantages: jax.Array, weights: jax.Array) -> jax.Array:
    """Advantages at mean 0 and (population) std 1 over the samples that count."""
    mean = weighted_mean(advantages, weights)
    std = jnp.sqrt(weighted_mean((advantages - mean) ** 2, weights))
    return (advantages - mean) / (std + 1e-8)


def gae_scan(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    dones: jax.Array,
    gamma: float,
    lam: float,
) -> jax.Array:
    """GAE advantages [T, N]: the recursion of ``rollout.gae`` as a reverse scan."""
    deltas, decays = advantage_terms(rewards, values, next_values, terminated, dones, gamma, lam)

    def backward(
        next_advantage: jax.Array, term: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        delta, decay = term
        advantage = delta + decay * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, decays), reverse=True
    )
    return advantages


class OnPolicyJaxLearner(JaxLearner, RolloutLearner):
    """The functions jitted, for ``HostTraining`` (Gymnasium engines): each iteration
    (``RolloutLearner``'s) collects a rollout on the host, computes its GAE advantages there,
    and updates in one jitted call."""

    def __init__(
        self,
        fns: OnPolicyFunctions,
        obs_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        cfg: RunConfig,
        seed: int,
    ) -> None:
        super().__init__(fns.init, seed)
        self.algo, self.updates_per_batch = cfg.algo, fns.updates_per_batch
        self.init_rollout(obs_space, action_space, cfg, norm_settings(fns))
        # Minibatch draws have a stream of their own, so the actions' stays as it was.
        self.update_key = jax_key(seed, Stream.REPLAY)
        self._act = jax.jit(fns.act)
        self._values = jax.jit(fns.values)
        self._greedy = jax.jit(fns.greedy)
        self._update = jax.jit(fns.update)

    def act(self, obs: XpArray) -> tuple[jax.Array, jax.Array, jax.Array]:
        actions: tuple[jax.Array, jax.Array, jax.Array]
        actions = self._act(self.agent.policy_params, obs, self.next_key())
        return actions

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._values(self.agent.value_params, obs))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._greedy(self.agent.policy_params, self.seen(obs)))

    def update(self, batch: RolloutBatch) -> dict[str, jax.Array]:
        self.update_key, key = jax.random.split(self.update_key)
        metrics: dict[str, jax.Array]
        self.agent, metrics = self._update(self.agent, batch, key)
        return metrics

    def agent_checkpoint(self) -> AgentCheckpoint:
        norm = None if self.normalization is None else self.normalization.state
        return checkpoint_tree(self.agent, norm)

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the agent and its keys, the normalisation statistics (and the
        updates per batch, the config's, as resume files have always held it)."""
        return {
            **self.agent_state(),
            "updates_per_batch": self.updates_per_batch,
            **self.rollout_state(),
            "update_key": tree_to_host(self.update_key),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_agent_state(state)
        self.load_rollout_state(state)
        self.update_key = tree_from_host(self.update_key, state["update_key"])


class OnPolicyState(NamedTuple):
    agent: PyTree
    env: VmapState
    key: jax.Array
    step: jax.Array
    updates: jax.Array
    # The running statistics (``rlspeed.core.algos.normalization``); None where none is on, so
    # such a state (and its resume file) is what it was before they existed.
    norm: NormState | None = None


class Transition(NamedTuple):
    obs: jax.Array
    actions: jax.Array
    log_probs: jax.Array
    result: StepResult


class ChunkStats(NamedTuple):
    """Per iteration of a chunk: finished episodes [iters, num_steps, num_envs] (in time
    order, as the monitor reads them) and the update's metrics [iters]."""

    done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    metrics: dict[str, jax.Array]


def norm_settings(fns: OnPolicyFunctions) -> NormSettings | None:
    """The normalisation an algorithm's functions ask for (``normalization``, optional)."""
    return getattr(fns, "normalization", None)


def normalized_greedy(
    fns: OnPolicyFunctions,
) -> tuple[Callable[[PyTree], PyTree], Callable[[PyTree, jax.Array], jax.Array]]:
    """(agent -> what the greedy policy needs, greedy policy on it): the policy parameters
    and, with observation normalisation, the observation statistics (``checkpoint_tree``)."""
    settings = norm_settings(fns)
    if settings is None or not settings.normalize_obs:
        return (lambda agent: agent["policy_params"]), fns.greedy

    def greedy(params: tuple[VariableDict, Moments], obs: jax.Array) -> jax.Array:
        policy_params, stats = params
        return fns.greedy(policy_params, standardized(stats, obs, settings.obs_clip, jnp))

    return (lambda agent: (agent["policy_params"], Moments(**agent["obs_norm"]))), greedy


class AgentTuple(Protocol):
    """An agent as a NamedTuple of its parts (parameters, optimizer states): a pytree."""

    def _asdict(self) -> dict[str, Any]: ...


def checkpoint_tree(agent: AgentTuple, norm: NormState | None) -> dict[str, Any]:
    """What a flax checkpoint holds: the agent's fields and, with observation
    normalisation, its statistics under ``obs_norm`` (the same on host and fused paths)."""
    tree: dict[str, Any] = agent._asdict()
    if norm is not None and norm.obs is not None:
        tree["obs_norm"] = norm.obs._asdict()
    return tree


def make_on_policy_train(cfg: RunConfig, env: VmapEnv, fns: OnPolicyFunctions) -> FusedTrainer:
    """The fused program of an on-policy algorithm: the host loop's steps, in JAX."""
    algo, n, horizon = cfg.algo, env.num_envs, cfg.algo.num_steps
    batch_size = horizon * n
    settings = norm_settings(fns)
    # Never None: gymnasium types every space's shape as optional, for the spaces without one
    # (Dict, Tuple), which no algorithm takes.
    obs_shape = cast("tuple[int, ...]", env.single_observation_space.shape)

    def init(keys: JaxKeys) -> OnPolicyState:
        agent = fns.init(keys.init)
        norm = init_state(settings, obs_shape, n, jnp)
        env_state = env.init(keys.env)
        return OnPolicyState(agent, env_state, keys.act, jnp.int32(0), jnp.int32(0), norm)

    def flat(x: jax.Array) -> jax.Array:
        return x.reshape(batch_size, *x.shape[2:])

    def iteration(state: OnPolicyState, _: None) -> tuple[OnPolicyState, ChunkStats]:
        key, rollout_key = jax.random.split(state.key)
        # Folded in, not split off: a key added to the split would move every action draw.
        update_key = jax.random.fold_in(rollout_key, horizon)
        agent = state.agent
        # The run's last batch takes only the steps that reach total_steps, as the host loop's
        # does; the program's shapes stay whole: the steps past ``length`` run but count for
        # nothing (no episode ends, no weight in the update, no statistics), and the
        # training ends there.
        length = rollout_length(cfg.total_steps - state.step, n, horizon, jnp)

        def env_step(
            carry: tuple[VmapState, NormState | None], xs: tuple[jax.Array, jax.Array]
        ) -> tuple[tuple[VmapState, NormState | None], Transition]:
            (env_state, norm), (step_key, t) = carry, xs
            new_norm, obs = observe(settings, norm, env_state.obs, jnp)
            actions, env_actions, log_probs = fns.act(agent.policy_params, obs, step_key)
            next_env_state, result = env.step(env_state, env_actions)
            if new_norm is not None:
                done = result.terminated | result.truncated
                new_norm, reward = scale_rewards(
                    settings, new_norm, result.reward, done, algo.gamma, jnp
                )
                final_obs = normalize(settings, new_norm, result.final_obs, jnp)
                result = result._replace(reward=reward, final_obs=final_obs)
                new_norm = jax.tree.map(lambda a, b: jnp.where(t < length, a, b), new_norm, norm)
            transition = Transition(obs, actions, log_probs, result)
            return (next_env_state, new_norm), transition

        steps = (jax.random.split(rollout_key, horizon), jnp.arange(horizon))
        (env_state, norm), trajectory = jax.lax.scan(env_step, (state.env, state.norm), steps)
        result = trajectory.result
        time_index = jnp.arange(horizon)[:, None]
        dones = (result.terminated | result.truncated) & (time_index < length)
        values = fns.values(agent.value_params, flat(trajectory.obs)).reshape(horizon, n)
        next_values = fns.values(agent.value_params, flat(result.final_obs)).reshape(horizon, n)
        advantages = gae_scan(
            result.reward,
            values,
            next_values,
            result.terminated,
            # Cut at the rollout's last step, as if the arrays ended there (the same for a
            # whole rollout: nothing follows its last step).
            dones | (time_index == length - 1),
            algo.gamma,
            algo.gae_lambda,
        )
        batch = RolloutBatch(
            flat(trajectory.obs),
            flat(trajectory.actions),
            trajectory.log_probs.reshape(-1),
            values.reshape(-1),
            advantages.reshape(-1),
            (advantages + values).reshape(-1),
        )
        agent, metrics = fns.update(agent, batch, update_key, valid=length * n)
        stats = ChunkStats(dones, result.episode_return, result.episode_length, metrics)
        step = state.step + length * n
        updates = state.updates + fns.updates_per_batch
        return OnPolicyState(agent, env_state, key, step, updates, norm), stats

    def summarize(stats: ChunkStats) -> dict[str, np.ndarray]:
        return {name: per_seed_mean(values) for name, values in stats.metrics.items()}

    greedy_params, greedy = normalized_greedy(fns)
    return FusedTrainer(
        init=init,
        run=scan_iterations(iteration),
        total_iterations=math.ceil(cfg.total_steps / batch_size),
        steps_per_iteration=batch_size,
        policy_params=lambda state: greedy_params(checkpoint_tree(state.agent, state.norm)),
        greedy=greedy,
        summarize=summarize,
        checkpoint=lambda state: checkpoint_tree(state.agent, state.norm),
    )
