"""VPG in Flax + Optax: ``VPGFunctions``, the pure functions the on-policy loop's flax side
(``rlspeed/algos/loops/jax_onpolicy.py``) turns into the host learner (Gymnasium engines)
and the fused program (``env=jax-vmap``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlspeed.algos.encoding import one_hot_classes
from rlspeed.algos.loops.fused import FusedTrainer, saved_agent_policies
from rlspeed.algos.loops.jax_onpolicy import OnPolicyJaxLearner, make_on_policy_train
from rlspeed.algos.loops.onpolicy import RolloutBatch
from rlspeed.algos.networks.flax import MLP
from rlspeed.engines.jax_vmap import VmapEnv
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
        self.updates_per_batch = 1 + algo.value_iterations
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

    def act(
        self, params: Any, obs: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sampled actions: (as sampled, as sent to the env: clipped to the bounds, their
        log-probabilities)."""
        out, log_std = self.policy.apply(params, obs)
        if self.continuous:
            actions = out + jnp.exp(log_std) * jax.random.normal(key, out.shape)
            env_actions = jnp.clip(actions, self.low, self.high)
        else:
            actions = env_actions = jax.random.categorical(key, out).astype(jnp.int32)
        return actions, env_actions, self._log_prob_entropy(out, log_std, actions)[0]

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
        return self._log_prob_entropy(*self.policy.apply(params, obs), actions)

    def _log_prob_entropy(
        self, out: jax.Array, log_std: jax.Array | None, actions: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        if self.continuous:
            z = (actions - out) * jnp.exp(-log_std)
            log_prob = jnp.sum(-0.5 * z**2 - log_std - LOG_SQRT_2PI, axis=-1)
            return log_prob, jnp.sum(log_std + 0.5 + LOG_SQRT_2PI)
        log_probs = jax.nn.log_softmax(out)
        log_prob = jnp.take_along_axis(log_probs, actions.astype(jnp.int32)[:, None], axis=1)
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=1)
        return log_prob[:, 0], entropy.mean()

    def update(
        self, agent: Agent, batch: RolloutBatch, key: jax.Array | None = None
    ) -> tuple[Agent, dict[str, jax.Array]]:
        """One policy gradient step, then ``value_iterations`` full-batch value steps; the
        value loss reported is the mean over those steps. Full-batch: ``key`` goes unused."""
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


class FlaxLearner(OnPolicyJaxLearner):
    def __init__(self, obs_space: Any, action_space: Any, cfg: Any, seed: int) -> None:
        super().__init__(VPGFunctions(obs_space, action_space, cfg.algo), seed)


def make_train(cfg: Any, env: VmapEnv) -> FusedTrainer:
    fns = VPGFunctions(env.single_observation_space, env.single_action_space, cfg.algo)
    return make_on_policy_train(cfg, env, fns)


def load_policies(cfg: Any, path: Path, obs_space: Any, action_space: Any) -> list[GreedyPolicy]:
    """The greedy policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    fns = VPGFunctions(obs_space, action_space, cfg.algo)
    return saved_agent_policies(cfg, path, fns.init, "policy_params", fns.greedy)
