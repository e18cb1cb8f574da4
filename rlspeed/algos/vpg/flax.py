"""VPG in Flax + Optax.

With a Gymnasium engine the Python loop of ``rlspeed/algos/vpg/rollout.py`` calls jitted
``act``, ``values`` and ``update``. With ``env=jax-vmap`` everything is fused: one
iteration of the ``lax.scan`` that ``make_train`` builds is a ``num_steps`` rollout (an
inner ``lax.scan``), GAE (a reverse ``lax.scan``) and the updates, driven by
``rlspeed/algos/fused.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlspeed.algos.encoding import one_hot_classes
from rlspeed.algos.fused import FusedTrainer, save_pytree, saved_policies, train_fused
from rlspeed.algos.networks.flax import MLP
from rlspeed.algos.vpg import advantage_terms
from rlspeed.algos.vpg.rollout import RolloutBatch, train_on_policy
from rlspeed.engines import StepResult
from rlspeed.engines.jax_vmap import VmapEnv, VmapState
from rlspeed.run import RunContext, TrainResult
from rlspeed.seeding import JaxKeys, Stream, jax_key
from rlspeed.tasks import Policy as GreedyPolicy

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class Policy(nn.Module):
    """Logits of a categorical (``initial_log_std`` None), or the mean and the learned,
    state-independent log std of a diagonal Gaussian."""

    out_size: int
    hidden_sizes: Sequence[int]
    classes: int
    initial_log_std: float | None

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        out = MLP(self.out_size, self.hidden_sizes, self.classes)(obs)
        if self.initial_log_std is None:
            return out, None
        init = nn.initializers.constant(self.initial_log_std)
        return out, self.param("log_std", init, (self.out_size,))


class Agent(NamedTuple):
    policy_params: Any
    value_params: Any
    policy_opt_state: Any
    value_opt_state: Any


def gae_scan(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    dones: jax.Array,
    gamma: float,
    lam: float,
) -> jax.Array:
    """GAE advantages [T, N]: the recursion of ``rlspeed.algos.vpg.gae`` as a reverse scan."""
    deltas, decays = advantage_terms(rewards, values, next_values, terminated, dones, gamma, lam)

    def backward(next_advantage: jax.Array, term: tuple[jax.Array, jax.Array]) -> tuple:
        delta, decay = term
        advantage = delta + decay * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, decays), reverse=True
    )
    return advantages


def _optimizer(learning_rate: float, max_grad_norm: float) -> optax.GradientTransformation:
    if max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate))
    return optax.adam(learning_rate)


class VPGFunctions:
    """Pure functions of one VPG configuration: init, act, values, greedy, update."""

    def __init__(self, obs_space: Any, action_space: Any, algo: Any) -> None:
        self.algo = algo
        self.continuous = bool(action_space.shape)
        classes = one_hot_classes(obs_space)
        hidden = tuple(algo.hidden_sizes)
        if self.continuous:
            out_size = int(np.prod(action_space.shape))
            self.low, self.high = jnp.asarray(action_space.low), jnp.asarray(action_space.high)
        else:
            out_size = int(action_space.n)
        log_std = float(algo.initial_log_std) if self.continuous else None
        self.policy = Policy(out_size, hidden, classes, log_std)
        self.value = MLP(1, hidden, classes)
        self.policy_optimizer = _optimizer(algo.policy_lr, algo.max_grad_norm)
        self.value_optimizer = _optimizer(algo.value_lr, algo.max_grad_norm)
        self._dummy_obs = jnp.zeros((1, *obs_space.shape), dtype=obs_space.dtype)

    def init(self, key: jax.Array) -> Agent:
        policy_key, value_key = jax.random.split(key)
        policy_params = self.policy.init(policy_key, self._dummy_obs)
        value_params = self.value.init(value_key, self._dummy_obs)
        return Agent(
            policy_params,
            value_params,
            self.policy_optimizer.init(policy_params),
            self.value_optimizer.init(value_params),
        )

    def act(self, params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Sampled actions: (as sampled, as sent to the env: clipped to the bounds)."""
        out, log_std = self.policy.apply(params, obs)
        if self.continuous:
            actions = out + jnp.exp(log_std) * jax.random.normal(key, out.shape)
            return actions, jnp.clip(actions, self.low, self.high)
        actions = jax.random.categorical(key, out).astype(jnp.int32)
        return actions, actions

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        out, _ = self.policy.apply(params, obs)
        if self.continuous:
            return jnp.clip(out, self.low, self.high)
        return out.argmax(axis=1)

    def values(self, params: Any, obs: jax.Array) -> jax.Array:
        return self.value.apply(params, obs)[:, 0]

    def log_prob_entropy(
        self, params: Any, obs: jax.Array, actions: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Log-probabilities of ``actions`` [B] and the policy's mean entropy."""
        out, log_std = self.policy.apply(params, obs)
        if self.continuous:
            z = (actions - out) * jnp.exp(-log_std)
            log_prob = jnp.sum(-0.5 * z**2 - log_std - LOG_SQRT_2PI, axis=-1)
            return log_prob, jnp.sum(log_std + 0.5 + LOG_SQRT_2PI)
        log_probs = jax.nn.log_softmax(out)
        log_prob = jnp.take_along_axis(log_probs, actions.astype(jnp.int32)[:, None], axis=1)
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=1)
        return log_prob[:, 0], entropy.mean()

    def update(self, agent: Agent, batch: RolloutBatch) -> tuple[Agent, dict[str, jax.Array]]:
        """One policy gradient step, then ``value_iterations`` full-batch value steps; the
        value loss reported is the mean over those steps."""
        algo = self.algo
        advantages = batch.advantages
        if algo.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        def policy_loss_fn(params: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            log_prob, entropy = self.log_prob_entropy(params, batch.obs, batch.actions)
            policy_loss = -jnp.mean(log_prob * advantages)
            return policy_loss - algo.ent_coef * entropy, (policy_loss, entropy)

        grads, (policy_loss, entropy) = jax.grad(policy_loss_fn, has_aux=True)(agent.policy_params)
        updates, policy_opt_state = self.policy_optimizer.update(
            grads, agent.policy_opt_state, agent.policy_params
        )
        policy_params = optax.apply_updates(agent.policy_params, updates)

        def value_step(carry: tuple[Any, Any], _: None) -> tuple[tuple[Any, Any], jax.Array]:
            params, opt_state = carry
            loss, grads = jax.value_and_grad(
                lambda p: jnp.mean((self.values(p, batch.obs) - batch.returns) ** 2)
            )(params)
            updates, opt_state = self.value_optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (value_params, value_opt_state), value_losses = jax.lax.scan(
            value_step,
            (agent.value_params, agent.value_opt_state),
            None,
            length=algo.value_iterations,
        )
        agent = Agent(policy_params, value_params, policy_opt_state, value_opt_state)
        return agent, {
            "losses/policy_loss": policy_loss,
            "losses/value_loss": value_losses.mean(),
            "losses/entropy": entropy,
        }


class FlaxLearner:
    """Jitted act/values/update for the Python-driven loop (Gymnasium engines)."""

    def __init__(self, obs_space: Any, action_space: Any, algo: Any, seed: int) -> None:
        self.fns = VPGFunctions(obs_space, action_space, algo)
        self.key = jax_key(seed, Stream.ACT)
        # Jitted: one compilation instead of one per eager operation.
        self.agent = jax.jit(self.fns.init)(jax_key(seed, Stream.INIT))
        self._act = jax.jit(self.fns.act)
        self._values = jax.jit(self.fns.values)
        self._greedy = jax.jit(self.fns.greedy)
        self._update = jax.jit(self.fns.update)

    def act(self, obs: Any) -> tuple[jax.Array, jax.Array]:
        self.key, key = jax.random.split(self.key)
        return self._act(self.agent.policy_params, obs, key)

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._values(self.agent.value_params, obs))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._greedy(self.agent.policy_params, obs))

    def update(self, batch: RolloutBatch) -> dict[str, jax.Array]:
        self.agent, metrics = self._update(self.agent, batch)
        return metrics

    def save(self, path: Path) -> Path:
        return save_pytree(self.agent._asdict(), path)


# ---------------------------------------------------------------- fused jax-vmap path


class TrainState(NamedTuple):
    agent: Agent
    env: VmapState
    key: jax.Array
    step: jax.Array
    updates: jax.Array


class Transition(NamedTuple):
    obs: jax.Array
    actions: jax.Array
    result: StepResult


class ChunkStats(NamedTuple):
    """Per iteration of a chunk: finished episodes [iters, num_steps, num_envs] (in time
    order, as the monitor reads them) and the update's metrics [iters]."""

    done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    metrics: dict[str, jax.Array]


def make_train(cfg: Any, env: VmapEnv) -> FusedTrainer:
    algo, n, horizon = cfg.algo, env.num_envs, cfg.algo.num_steps
    fns = VPGFunctions(env.single_observation_space, env.single_action_space, algo)
    batch_size = horizon * n
    total_iterations = math.ceil(cfg.total_steps / batch_size)

    def init(keys: JaxKeys) -> TrainState:
        agent = fns.init(keys.init)
        return TrainState(agent, env.init(keys.env), keys.act, jnp.int32(0), jnp.int32(0))

    def flat(x: jax.Array) -> jax.Array:
        return x.reshape(batch_size, *x.shape[2:])

    def iteration(state: TrainState, _: None) -> tuple[TrainState, ChunkStats]:
        key, rollout_key = jax.random.split(state.key)
        agent = state.agent

        def env_step(env_state: VmapState, step_key: jax.Array) -> tuple[VmapState, Transition]:
            actions, env_actions = fns.act(agent.policy_params, env_state.obs, step_key)
            next_env_state, result = env.step(env_state, env_actions)
            return next_env_state, Transition(env_state.obs, actions, result)

        env_state, trajectory = jax.lax.scan(
            env_step, state.env, jax.random.split(rollout_key, horizon)
        )
        result = trajectory.result
        dones = result.terminated | result.truncated
        values = fns.values(agent.value_params, flat(trajectory.obs)).reshape(horizon, n)
        next_values = fns.values(agent.value_params, flat(result.final_obs)).reshape(horizon, n)
        advantages = gae_scan(
            result.reward,
            values,
            next_values,
            result.terminated,
            dones,
            algo.gamma,
            algo.gae_lambda,
        )
        batch = RolloutBatch(
            flat(trajectory.obs),
            flat(trajectory.actions),
            advantages.reshape(-1),
            (advantages + values).reshape(-1),
        )
        agent, metrics = fns.update(agent, batch)
        stats = ChunkStats(dones, result.episode_return, result.episode_length, metrics)
        step = state.step + batch_size
        updates = state.updates + 1 + algo.value_iterations
        return TrainState(agent, env_state, key, step, updates), stats

    def run(state: TrainState, iterations: int) -> tuple[TrainState, ChunkStats]:
        return jax.lax.scan(iteration, state, None, length=iterations)

    def summarize(stats: ChunkStats) -> dict[str, float]:
        return {name: float(np.mean(values)) for name, values in stats.metrics.items()}

    return FusedTrainer(
        init=init,
        run=run,
        total_iterations=total_iterations,
        steps_per_iteration=batch_size,
        policy_params=lambda state: state.agent.policy_params,
        greedy=fns.greedy,
        checkpoint=lambda state: state.agent._asdict(),
        summarize=summarize,
    )


def train(ctx: RunContext) -> TrainResult:
    if ctx.engine.needs_functional_env:
        return train_fused(ctx, make_train)
    return ctx.each_seed(
        lambda seed_ctx: train_on_policy(
            seed_ctx,
            partial(FlaxLearner, algo=ctx.cfg.algo, seed=seed_ctx.seed),
            "checkpoint.msgpack",
        )
    )


def load_policies(
    cfg: Any, path: Path, obs_space: Any, action_space: Any
) -> list[GreedyPolicy]:
    """The greedy policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    fns = VPGFunctions(obs_space, action_space, cfg.algo)
    template = fns.init(jax.random.key(0))._asdict()
    return saved_policies(cfg, path, template, lambda agent: agent["policy_params"], fns.greedy)
