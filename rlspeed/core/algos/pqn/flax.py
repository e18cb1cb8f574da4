"""PQN in Flax + Optax: ``PQNFunctions``, the pure functions (act, values, loss, update)
that the on-policy rollouts in JAX (``rlspeed/core/algos/rollout_jax.py``: collect, the
returns by GAE's recursion over max_a Q) turn into the host learner (Gymnasium engines) and
the fused program (``env=jax-vmap``). The update is PPO's minibatched passes
(``rlspeed.core.algos.ppo.flax.minibatch_steps``) on the squared error of Q(s, a) to the
Q(lambda) returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rlspeed.core.algos.dqn.flax import epsilon_greedy
from rlspeed.core.algos.encoding import one_hot_classes, through_torso
from rlspeed.core.algos.loops.fused import FusedTrainer, saved_agent_policies
from rlspeed.core.algos.networks.flax import MLP, apply_output, example_observations
from rlspeed.core.algos.ppo import batches_in_run
from rlspeed.core.algos.ppo.flax import minibatch_steps, optimizer
from rlspeed.core.algos.pqn import PQNConfig
from rlspeed.core.algos.rollout import RolloutBatch
from rlspeed.core.algos.rollout_jax import (
    OnPolicyJaxLearner,
    make_on_policy_train,
    weighted_mean,
)
from rlspeed.core.algos.schedule import epsilon_at
from rlspeed.core.envs.vmap import VmapEnv
from rlspeed.core.tasks import Policy

if TYPE_CHECKING:
    from flax.typing import VariableDict
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint


class Behaviour(NamedTuple):
    """The epsilon-greedy policy: the Q-network's parameters and the env steps collected so
    far, the clock of its exploration rate (the torch learner's ``steps``)."""

    q_params: VariableDict
    steps: jax.Array


class Agent(NamedTuple):
    # What the rollouts act with (``policy_params``, as the on-policy loops name it).
    policy_params: Behaviour
    # Adam over the Q-network's parameters.
    opt_state: optax.OptState

    @property
    def value_params(self) -> Behaviour:
        """What the rollouts take values with: the same Q-network (max over actions)."""
        return self.policy_params


class PQNFunctions:
    """Pure functions of one PQN configuration: init, act, values, greedy, loss, update.
    ``batches``: the batches of the run, over which ``anneal_lr`` takes the step size to 0."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Discrete,
        algo: PQNConfig,
        total_steps: int,
        batches: int,
    ) -> None:
        self.algo, self.total_steps = algo, total_steps
        self.n_actions = int(action_space.n)
        hidden = tuple(algo.hidden_sizes)
        classes = one_hot_classes(obs_space)
        torso = through_torso(obs_space, algo.network)
        self.network = MLP(self.n_actions, hidden, classes, nn.relu, layer_norm=True, torso=torso)
        self.updates_per_batch = algo.update_epochs * algo.num_minibatches
        self.optimizer = optimizer(algo, self.updates_per_batch, batches)
        self._dummy_obs = example_observations(obs_space)

    def init(self, key: jax.Array) -> Agent:
        params = self.network.init(key, self._dummy_obs)
        return Agent(Behaviour(params, jnp.int32(0)), self.optimizer.init(params))

    def q_values(self, params: VariableDict, obs: jax.Array) -> jax.Array:
        return apply_output(self.network, params, obs)

    def epsilon(self, steps: jax.Array) -> jax.Array:
        epsilon: jax.Array = epsilon_at(steps, self.algo, self.total_steps, jnp)
        return epsilon

    def act(
        self, policy: Behaviour, obs: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Epsilon-greedy actions, as the rollouts store them: (actions, the same sent to the
        env, log-probabilities: zeros, which PQN does not read)."""
        greedy = self.q_values(policy.q_params, obs).argmax(axis=1)
        actions = epsilon_greedy(greedy, key, self.epsilon(policy.steps), self.n_actions)
        return actions, actions, jnp.zeros(obs.shape[0])

    def values(self, policy: Behaviour, obs: jax.Array) -> jax.Array:
        """max_a Q(obs, a): what the Q(lambda) returns bootstrap from."""
        return self.q_values(policy.q_params, obs).max(axis=1)

    def greedy(self, policy: Behaviour, obs: jax.Array) -> jax.Array:
        return self.q_values(policy.q_params, obs).argmax(axis=1)

    def loss(
        self, params: VariableDict, minibatch: RolloutBatch, weights: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The squared error of Q(s, a) to the Q(lambda) return; means over the samples
        whose ``weights`` are 1."""
        q_all = self.q_values(params, minibatch.obs)
        actions = minibatch.actions.astype(jnp.int32)[:, None]
        q = jnp.take_along_axis(q_all, actions, axis=1)[:, 0]
        td_loss = weighted_mean((q - minibatch.returns) ** 2, weights)
        return td_loss, {"losses/td_loss": td_loss, "losses/q_values": weighted_mean(q, weights)}

    def update(
        self,
        agent: Agent,
        batch: RolloutBatch,
        key: jax.Array,
        orders: jax.Array | None = None,
        *,
        valid: jax.Array | None = None,
    ) -> tuple[Agent, dict[str, jax.Array]]:
        """PPO's passes over the batch (``minibatch_steps``: ``orders``, ``valid``), with
        the exploration rate the batch was collected at; the clock moves on by its steps."""
        behaviour = agent.policy_params
        q_params, opt_state, metrics = minibatch_steps(
            self, behaviour.q_params, agent.opt_state, batch, key, orders, valid
        )
        steps = batch.obs.shape[0] if valid is None else valid
        metrics["charts/epsilon"] = self.epsilon(behaviour.steps)
        return Agent(Behaviour(q_params, behaviour.steps + steps), opt_state), metrics


def functions(
    cfg: RunConfig, obs_space: spaces.Space[Any], action_space: spaces.Discrete
) -> PQNFunctions:
    """The functions of the run ``cfg``."""
    batches = batches_in_run(cfg.algo, cfg)
    return PQNFunctions(obs_space, action_space, cfg.algo, cfg.total_steps, batches)


class FlaxLearner(OnPolicyJaxLearner):
    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        fns = functions(cfg, obs_space, action_space)
        super().__init__(fns, obs_space, action_space, cfg, seed)


def make_train(cfg: RunConfig, env: VmapEnv) -> FusedTrainer:
    # PQN acts in Discrete spaces (its SPEC's action kinds: the checks see to it).
    action_space = cast("spaces.Discrete", env.single_action_space)
    fns = functions(cfg, env.single_observation_space, action_space)
    return make_on_policy_train(cfg, env, fns)


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Discrete,
) -> list[Policy]:
    """The greedy policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    fns = functions(cfg, obs_space, action_space)
    return saved_agent_policies(cfg, saved, fns.init, "policy_params", fns.greedy)
