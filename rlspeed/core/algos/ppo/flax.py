"""PPO in Flax + Optax: ``PPOFunctions``, the pure functions (loss, update) that the
on-policy rollouts in JAX (``rlspeed/core/algos/rollout_jax.py``: collect, GAE) turn into
the host learner (Gymnasium engines) and the fused program (``env=jax-vmap``). The
networks, acting and log-probabilities are the on-policy ``ActorCritic`` VPG has too; PPO
brings its own optimizer, loss and update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, cast

import jax
import jax.numpy as jnp
import optax

from rlspeed.core.algos.loops.fused import FusedTrainer, saved_policies
from rlspeed.core.algos.networks.flax import ActorCritic
from rlspeed.core.algos.normalization import init_state, settings_of
from rlspeed.core.algos.ppo import (
    MinibatchSettings,
    PPOConfig,
    annealed_rate,
    batches_in_run,
    minibatch_positions,
)
from rlspeed.core.algos.rollout import RolloutBatch
from rlspeed.core.algos.rollout_jax import (
    OnPolicyJaxLearner,
    checkpoint_tree,
    make_on_policy_train,
    normalized,
    normalized_greedy,
    weighted_mean,
)
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
    # One Adam over (policy_params, value_params).
    opt_state: optax.OptState


class PPOFunctions(ActorCritic):
    """Pure functions of one PPO configuration: init, act, values, greedy, update.
    ``batches``: the batches of the run, over which ``anneal_lr`` takes the step size to 0."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        algo: PPOConfig,
        batches: int,
    ) -> None:
        super().__init__(obs_space, action_space, algo, algo.orthogonal_init)
        self.algo = algo
        # What the rollouts normalise (``rollout_jax.norm_settings``).
        self.normalization = settings_of(algo, obs_space)
        self.updates_per_batch = algo.update_epochs * algo.num_minibatches
        self.optimizer = optimizer(algo, self.updates_per_batch, batches)

    def init(self, key: jax.Array) -> Agent:
        params = self.init_params(key)
        return Agent(*params, self.optimizer.init(params))

    def loss(
        self, params: tuple[VariableDict, VariableDict], minibatch: RolloutBatch, weights: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The minibatch's total loss, and its parts as the metrics report them; means over
        the samples whose ``weights`` are 1."""
        algo = self.algo

        def mean(x: jax.Array) -> jax.Array:
            return weighted_mean(x, weights)

        policy_params, value_params = params
        log_prob, entropy = self.log_prob_entropy(policy_params, minibatch.obs, minibatch.actions)
        entropy = mean(entropy)
        log_ratio = log_prob - minibatch.log_probs
        ratio = jnp.exp(log_ratio)
        advantages = minibatch.advantages
        if algo.normalize_advantages:
            advantages = normalized(advantages, weights)
        clipped_ratio = jnp.clip(ratio, 1 - algo.clip_coef, 1 + algo.clip_coef)
        policy_loss = mean(jnp.maximum(-advantages * ratio, -advantages * clipped_ratio))

        values = self.values(value_params, minibatch.obs)
        squared_error = (values - minibatch.returns) ** 2
        if algo.clip_vloss:
            change = jnp.clip(values - minibatch.values, -algo.clip_coef, algo.clip_coef)
            clipped_error = (minibatch.values + change - minibatch.returns) ** 2
            squared_error = jnp.maximum(squared_error, clipped_error)
        value_loss = 0.5 * mean(squared_error)

        total = policy_loss - algo.ent_coef * entropy + algo.vf_coef * value_loss
        return total, {
            "losses/policy_loss": policy_loss,
            "losses/value_loss": value_loss,
            "losses/entropy": entropy,
            # KL(old || new) by the low-variance estimator (r - 1) - log r.
            "losses/approx_kl": mean((ratio - 1) - log_ratio),
            "losses/clipfrac": mean(jnp.abs(ratio - 1) > algo.clip_coef),
        }

    def update(
        self,
        agent: Agent,
        batch: RolloutBatch,
        key: jax.Array,
        orders: jax.Array | None = None,
        *,
        valid: jax.Array | None = None,
    ) -> tuple[Agent, dict[str, jax.Array]]:
        """``minibatch_steps`` of the policy and value networks on the batch."""
        params = (agent.policy_params, agent.value_params)
        (policy_params, value_params), opt_state, metrics = minibatch_steps(
            self, params, agent.opt_state, batch, key, orders, valid
        )
        return Agent(policy_params, value_params, opt_state), metrics


# The parameters one optimizer steps: a pytree of the algorithm's.
Params = TypeVar("Params")
ParamsIn = TypeVar("ParamsIn", contravariant=True)


class MinibatchLoss(Protocol[ParamsIn]):
    """What ``minibatch_steps`` takes of an algorithm's functions (PPO's, PQN's)."""

    @property
    def algo(self) -> MinibatchSettings: ...
    @property
    def optimizer(self) -> optax.GradientTransformation: ...
    @property
    def updates_per_batch(self) -> int: ...

    def loss(
        self, params: ParamsIn, minibatch: RolloutBatch, weights: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The minibatch's loss, and the step's metrics; means over the samples whose
        ``weights`` are 1."""


def minibatch_steps(
    fns: MinibatchLoss[Params],
    params: Params,
    opt_state: optax.OptState,
    batch: RolloutBatch,
    key: jax.Array,
    orders: jax.Array | None = None,
    valid: jax.Array | None = None,
) -> tuple[Params, optax.OptState, dict[str, jax.Array]]:
    """PPO's update of a batch (PQN's too): ``update_epochs`` passes over it in
    ``num_minibatches`` minibatches, one gradient step of ``fns.optimizer`` on ``fns.loss``
    each; metrics are the means over the steps. ``orders`` [update_epochs, batch]: each
    pass's order (default: permutations drawn from ``key``). ``valid``: only the batch's
    first ``valid`` samples count (a run's last batch on the fused path); the drawn orders
    put them first."""
    algo = fns.algo
    size = batch.obs.shape[0]
    if orders is None:
        keys = jax.random.split(key, algo.update_epochs)
        orders = jax.vmap(lambda k: jax.random.permutation(k, size))(keys)
        if valid is not None:  # stable: whole batches keep the drawn order
            orders = jax.vmap(lambda o: o[jnp.argsort(o >= valid, stable=True)])(orders)
    positions, counts = minibatch_positions(size, algo.num_minibatches, jnp, valid)
    minibatches = orders[:, positions].reshape(fns.updates_per_batch, -1)
    weights = jnp.tile(counts.astype(jnp.float32), (algo.update_epochs, 1))

    def step(
        carry: tuple[Params, optax.OptState], minibatch: tuple[jax.Array, jax.Array]
    ) -> tuple[tuple[Params, optax.OptState], dict[str, jax.Array]]:
        params, opt_state = carry
        indices, minibatch_weights = minibatch
        samples = jax.tree.map(lambda x: x[indices], batch)
        grads, metrics = jax.grad(fns.loss, has_aux=True)(params, samples, minibatch_weights)
        updates, opt_state = fns.optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(step, (params, opt_state), (minibatches, weights))
    return params, opt_state, {name: values.mean() for name, values in metrics.items()}


def optimizer(
    algo: MinibatchSettings, updates_per_batch: int, batches: int
) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; annealed, the step size of each batch is
    ``annealed_rate``'s (optax counts gradient steps: ``updates_per_batch`` a batch)."""

    def annealed(count: jax.Array) -> jax.Array:
        rate: jax.Array = annealed_rate(algo, count // updates_per_batch, batches)
        return rate

    adam = optax.adam(annealed if algo.anneal_lr else algo.learning_rate, eps=1e-5)
    if algo.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(algo.max_grad_norm), adam)
    return adam


def functions(
    cfg: RunConfig, obs_space: spaces.Space[Any], action_space: spaces.Box | spaces.Discrete
) -> PPOFunctions:
    """The functions of the run ``cfg``."""
    return PPOFunctions(obs_space, action_space, cfg.algo, batches_in_run(cfg.algo, cfg))


class FlaxLearner(OnPolicyJaxLearner):
    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        fns = functions(cfg, obs_space, action_space)
        super().__init__(fns, obs_space, action_space, cfg, seed)


def make_train(cfg: RunConfig, env: VmapEnv) -> FusedTrainer:
    # PPO acts in Box or Discrete spaces (its SPEC's action kinds: the checks see to it).
    action_space = cast("spaces.Box | spaces.Discrete", env.single_action_space)
    fns = functions(cfg, env.single_observation_space, action_space)
    return make_on_policy_train(cfg, env, fns)


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Box | spaces.Discrete,
) -> list[GreedyPolicy]:
    """The greedy policies of a saved ``checkpoint.msgpack`` (``mode=eval``): with
    observation normalisation, on observations normalised by its saved statistics."""
    fns = functions(cfg, obs_space, action_space)
    # Never None: gymnasium types every space's shape as optional, for the spaces without one
    # (Dict, Tuple), which no algorithm takes.
    obs_shape = cast("tuple[int, ...]", obs_space.shape)
    norm = init_state(fns.normalization, obs_shape, 1, jnp)
    template = checkpoint_tree(fns.init(jax.random.key(0)), norm)
    params_of, greedy = normalized_greedy(fns)
    return saved_policies(cfg, saved, template, params_of, greedy)
