"""SAC in Flax + Optax.

``SACFunctions`` holds the pure functions. With a Gymnasium engine ``FlaxLearner`` calls
them jitted, under ``rlspeed.core.algos.loops.host.HostTraining`` (TD3's
``ActorCriticLearner``); with ``env=jax-vmap`` ``make_train`` fuses acting, stepping,
storing and updating into one ``lax.scan`` (TD3's ``actor_critic_program``). The twin
critics are one parameter pytree stacked on a leading axis of 2, evaluated with
``jax.vmap``, as TD3's are.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlspeed.core.algos.loops.fused import FusedTrainer, saved_agent_policies
from rlspeed.core.algos.networks.flax import MLP, apply_output
from rlspeed.core.algos.replay import Batch
from rlspeed.core.algos.sac import SACConfig, draw_normal, greedy_actions, sample
from rlspeed.core.algos.td3 import action_bounds, uniform_actions
from rlspeed.core.algos.td3.flax import (
    ActorCriticLearner,
    Noise,
    QNetwork,
    actor_critic_program,
    box_spaces,
    critic_step,
)
from rlspeed.core.envs.vmap import VmapEnv
from rlspeed.core.tasks import Policy

if TYPE_CHECKING:
    from flax.typing import VariableDict
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint

    # One update's metrics by name.
    Metrics = dict[str, jax.Array]


class Agent(NamedTuple):
    actor_params: VariableDict
    critic_params: VariableDict  # Q1 and Q2, stacked on a leading axis of 2
    critic_target: VariableDict
    log_alpha: jax.Array  # the entropy coefficient's log, a scalar
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    alpha_opt_state: optax.OptState


class SACFunctions:
    """Pure functions of one SAC configuration: init, act, and the update."""

    def __init__(self, obs_space: spaces.Box, action_space: spaces.Box, algo: SACConfig) -> None:
        self.algo = algo
        self.bounds = action_bounds(action_space, jnp.asarray)
        action_dim = int(np.prod(action_space.shape))
        self.target_entropy = -float(action_dim)
        hidden = tuple(algo.hidden_sizes)
        self.actor_net = MLP(2 * action_dim, hidden, classes=0, activation=nn.relu)
        self.critic_net = QNetwork(hidden)
        # The critics and the entropy coefficient step at q_lr (CleanRL's choice).
        self.q_optimizer = optax.adam(algo.q_lr)
        self.actor_optimizer = optax.adam(algo.policy_lr)
        self.actor_metrics = ("losses/actor_loss",) + (
            ("losses/alpha_loss",) if algo.autotune else ()
        )
        critic_metrics = ("qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "alpha")
        self.metric_names = tuple(f"losses/{name}" for name in critic_metrics) + self.actor_metrics
        self._dummy_obs = jnp.zeros((1, *obs_space.shape), jnp.float32)
        self._dummy_actions = jnp.zeros((1, *action_space.shape), jnp.float32)

    def init(self, key: jax.Array) -> Agent:
        actor_key, critic_key = jax.random.split(key)
        actor = self.actor_net.init(actor_key, self._dummy_obs)
        critics = jax.vmap(self.critic_net.init, in_axes=(0, None, None))(
            jax.random.split(critic_key), self._dummy_obs, self._dummy_actions
        )
        log_alpha = jnp.log(jnp.asarray(self.algo.alpha, jnp.float32))
        return Agent(
            actor,
            critics,
            critics,
            log_alpha,
            self.actor_optimizer.init(actor),
            self.q_optimizer.init(critics),
            self.q_optimizer.init(log_alpha),
        )

    def policy(
        self, params: VariableDict, obs: jax.Array, normal: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Actions drawn with the standard-normal ``normal`` and their log-probabilities."""
        actions, log_prob = sample(
            apply_output(self.actor_net, params, obs), normal, self.bounds, jnp
        )
        return actions, log_prob

    def actor(self, params: VariableDict, obs: jax.Array) -> jax.Array:
        """The deterministic (greedy) actions: the squashed mean."""
        actions: jax.Array = greedy_actions(
            apply_output(self.actor_net, params, obs), self.bounds, jnp
        )
        return actions

    def critics(self, params: VariableDict, obs: jax.Array, actions: jax.Array) -> jax.Array:
        """Q1 and Q2 of each (obs, action): shape [2, B]."""
        critic = partial(apply_output, self.critic_net)
        return jax.vmap(critic, in_axes=(0, None, None))(params, obs, actions)

    def init_noise(self, num_envs: int) -> Noise:
        """OU exploration's carried draws start at 0; Gaussian exploration carries none."""
        if self.algo.exploration == "ou":
            return jnp.zeros((num_envs, *self.bounds.low.shape), jnp.float32)
        return ()

    def act(
        self, params: VariableDict, obs: jax.Array, key: jax.Array, step: jax.Array, noise: Noise
    ) -> tuple[jax.Array, Noise]:
        """Uniformly random actions before ``learning_starts``, then the policy's samples;
        OU exploration's draws move from ``learning_starts`` on (0 until then)."""
        normal_key, random_key = jax.random.split(key)
        shape = (obs.shape[0], *self.bounds.low.shape)
        normal, moved = draw_normal(noise, jax.random.normal(normal_key, shape), self.algo)
        sampled, _ = self.policy(params, obs, normal)
        random = uniform_actions(jax.random.uniform(random_key, shape), self.bounds)
        learning = step >= self.algo.learning_starts
        noise = jax.tree.map(lambda new, old: jnp.where(learning, new, old), moved, noise)
        return jnp.where(learning, sampled, random), noise

    def noise(self, key: jax.Array, actions_shape: tuple[int, ...]) -> jax.Array:
        """The policy's draws of one update: the next actions', then each policy step's."""
        return jax.random.normal(key, (1 + self.algo.policy_frequency, *actions_shape))

    def update_critics(
        self, agent: Agent, batch: Batch[jax.Array], normal: jax.Array
    ) -> tuple[Agent, Metrics]:
        algo = self.algo
        alpha = jnp.exp(agent.log_alpha)
        # Targets: the soft value of the next observation under the current policy.
        next_actions, next_log_prob = self.policy(agent.actor_params, batch.next_obs, normal)
        next_q = self.critics(agent.critic_target, batch.next_obs, next_actions).min(axis=0)
        target = batch.rewards + algo.gamma * (1.0 - batch.dones) * (next_q - alpha * next_log_prob)
        critics, opt_state = agent.critic_params, agent.critic_opt_state
        params, opt_state, losses, q_means = critic_step(
            self.critics, self.q_optimizer, critics, opt_state, batch, target
        )
        agent = agent._replace(critic_params=params, critic_opt_state=opt_state)
        metrics = {
            "losses/qf1_values": q_means[0],
            "losses/qf2_values": q_means[1],
            "losses/qf1_loss": losses[0],
            "losses/qf2_loss": losses[1],
            "losses/qf_loss": losses.mean(),
            "losses/alpha": alpha,
        }
        return agent, metrics

    def update_policy(
        self, agent: Agent, batch: Batch[jax.Array], noise: jax.Array
    ) -> tuple[Agent, Metrics]:
        """One policy step per draw in ``noise``, each followed by the entropy coefficient's
        where it is tuned; their mean losses."""

        def policy_step(agent: Agent, normal: jax.Array) -> tuple[Agent, Metrics]:
            alpha = jnp.exp(agent.log_alpha)

            def actor_loss_fn(params: VariableDict) -> tuple[jax.Array, jax.Array]:
                actions, log_prob = self.policy(params, batch.obs, normal)
                q = self.critics(agent.critic_params, batch.obs, actions).min(axis=0)
                return (alpha * log_prob - q).mean(), log_prob

            (actor_loss, log_prob), grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(
                agent.actor_params
            )
            updates, opt_state = self.actor_optimizer.update(
                grads, agent.actor_opt_state, agent.actor_params
            )
            agent = agent._replace(
                actor_params=optax.apply_updates(agent.actor_params, updates),
                actor_opt_state=opt_state,
            )
            losses = {"losses/actor_loss": actor_loss}
            if self.algo.autotune:
                # Raise alpha while the entropy (-log_prob) is below its target, else lower it.
                entropy_gap = log_prob + self.target_entropy

                def alpha_loss_fn(log_alpha: jax.Array) -> jax.Array:
                    loss: jax.Array = -(jnp.exp(log_alpha) * entropy_gap).mean()
                    return loss

                alpha_loss, grad = jax.value_and_grad(alpha_loss_fn)(agent.log_alpha)
                updates, opt_state = self.q_optimizer.update(
                    grad, agent.alpha_opt_state, agent.log_alpha
                )
                agent = agent._replace(
                    log_alpha=optax.apply_updates(agent.log_alpha, updates),
                    alpha_opt_state=opt_state,
                )
                losses["losses/alpha_loss"] = alpha_loss
            return agent, losses

        agent, losses = jax.lax.scan(policy_step, agent, noise)
        return agent, {name: values.mean() for name, values in losses.items()}

    def update(
        self, agent: Agent, batch: Batch[jax.Array], noise: jax.Array, actor_step: jax.Array
    ) -> tuple[Agent, Metrics]:
        """One critic update, the policy's where ``actor_step`` (its losses 0 elsewhere),
        then the target critics' Polyak step. ``noise``: ``self.noise``'s draws."""
        agent, metrics = self.update_critics(agent, batch, noise[0])

        def no_policy_step(agent: Agent, *_: object) -> tuple[Agent, Metrics]:
            return agent, dict.fromkeys(self.actor_metrics, jnp.float32(0.0))

        agent, policy_metrics = jax.lax.cond(
            actor_step, self.update_policy, no_policy_step, agent, batch, noise[1:]
        )
        target = optax.incremental_update(agent.critic_params, agent.critic_target, self.algo.tau)
        return agent._replace(critic_target=target), metrics | policy_metrics


class FlaxLearner(ActorCriticLearner):
    functions = SACFunctions


def make_train(cfg: RunConfig, env: VmapEnv) -> FusedTrainer:
    return actor_critic_program(cfg, env, SACFunctions(*box_spaces(env), cfg.algo))


def load_policies(
    cfg: RunConfig, saved: AgentCheckpoint, obs_space: spaces.Box, action_space: spaces.Box
) -> list[Policy]:
    """The deterministic policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    fns = SACFunctions(obs_space, action_space, cfg.algo)
    return saved_agent_policies(cfg, saved, fns.init, "actor_params", fns.actor)
