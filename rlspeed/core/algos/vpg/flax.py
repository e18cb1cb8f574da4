"""VPG in Flax + Optax: ``VPGFunctions``, the pure functions (losses, update) that the
on-policy rollouts in JAX (``rlspeed/core/algos/rollout_jax.py``: collect, GAE) turn into
the host learner (Gymnasium engines) and the fused program (``env=jax-vmap``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, cast

import jax
import optax

from rlspeed.core.algos.loops.fused import FusedTrainer, saved_agent_policies
from rlspeed.core.algos.networks.flax import ActorCritic
from rlspeed.core.algos.rollout import RolloutBatch
from rlspeed.core.algos.rollout_jax import (
    OnPolicyJaxLearner,
    make_on_policy_train,
    normalized,
    sample_weights,
    weighted_mean,
)
from rlspeed.core.algos.vpg import VPGConfig
from rlspeed.core.envs.vmap import VmapEnv
from rlspeed.core.tasks import Policy as GreedyPolicy

if TYPE_CHECKING:
    from flax.typing import VariableDict
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint


class Agent(NamedTuple):
    policy_params: VariableDict
    value_params: VariableDict
    policy_opt_state: optax.OptState
    value_opt_state: optax.OptState


def _optimizer(learning_rate: float, max_grad_norm: float) -> optax.GradientTransformation:
    if max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate))
    return optax.adam(learning_rate)


class VPGFunctions(ActorCritic):
    """Pure functions of one VPG configuration: init, act, values, greedy, update."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        algo: VPGConfig,
    ) -> None:
        super().__init__(obs_space, action_space, algo)
        self.algo = algo
        self.updates_per_batch = 1 + algo.value_iterations
        self.policy_optimizer = _optimizer(algo.policy_lr, algo.max_grad_norm)
        self.value_optimizer = _optimizer(algo.value_lr, algo.max_grad_norm)

    def init(self, key: jax.Array) -> Agent:
        policy_params, value_params = self.init_params(key)
        return Agent(
            policy_params,
            value_params,
            self.policy_optimizer.init(policy_params),
            self.value_optimizer.init(value_params),
        )

    def update(
        self,
        agent: Agent,
        batch: RolloutBatch,
        key: jax.Array | None = None,
        *,
        valid: jax.Array | None = None,
    ) -> tuple[Agent, dict[str, jax.Array]]:
        """One policy gradient step, then ``value_iterations`` full-batch value steps; the
        value loss reported is the mean over those steps. Full-batch: ``key`` goes unused.
        ``valid``: only the batch's first ``valid`` samples count (a run's last batch on the
        fused path)."""
        algo = self.algo
        weights = sample_weights(batch.obs.shape[0], valid)
        advantages = batch.advantages
        if algo.normalize_advantages:
            advantages = normalized(advantages, weights)

        def policy_loss_fn(
            params: VariableDict,
        ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            log_prob, entropy = self.log_prob_entropy(params, batch.obs, batch.actions)
            policy_loss = -weighted_mean(log_prob * advantages, weights)
            entropy = weighted_mean(entropy, weights)
            return policy_loss - algo.ent_coef * entropy, (policy_loss, entropy)

        grads, (policy_loss, entropy) = jax.grad(policy_loss_fn, has_aux=True)(agent.policy_params)
        updates, policy_opt_state = self.policy_optimizer.update(
            grads, agent.policy_opt_state, agent.policy_params
        )
        policy_params = optax.apply_updates(agent.policy_params, updates)

        def value_step(
            carry: tuple[VariableDict, optax.OptState], _: None
        ) -> tuple[tuple[VariableDict, optax.OptState], jax.Array]:
            params, opt_state = carry
            loss, grads = jax.value_and_grad(
                lambda p: weighted_mean((self.values(p, batch.obs) - batch.returns) ** 2, weights)
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
    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        fns = VPGFunctions(obs_space, action_space, cfg.algo)
        super().__init__(fns, obs_space, action_space, cfg, seed)


def make_train(cfg: RunConfig, env: VmapEnv) -> FusedTrainer:
    # VPG acts in Box or Discrete spaces (its SPEC's action kinds: the checks see to it).
    action_space = cast("spaces.Box | spaces.Discrete", env.single_action_space)
    fns = VPGFunctions(env.single_observation_space, action_space, cfg.algo)
    return make_on_policy_train(cfg, env, fns)


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Box | spaces.Discrete,
) -> list[GreedyPolicy]:
    """The greedy policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    fns = VPGFunctions(obs_space, action_space, cfg.algo)
    return saved_agent_policies(cfg, saved, fns.init, "policy_params", fns.greedy)
