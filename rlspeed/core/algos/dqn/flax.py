"""DQN in Flax + Optax.

``DQNFunctions`` holds the pure functions. With a Gymnasium engine ``FlaxLearner`` calls
them jitted, under ``rlspeed.core.algos.loops.host.HostTraining``: each iteration
(``ReplayLearner.iteration``, shared with TD3) collects with ``act`` into the replay buffer,
then learns with ``update`` as often as due, then syncs the target network as due
(``DQNSchedule.after_env_steps``). With ``env=jax-vmap`` everything is fused: ``make_train``
builds pure functions in which acting, stepping, storing and updating run inside one
``lax.scan`` with the replay buffer in JAX arrays (driven by
``rlspeed/core/algos/loops/fused.py``).
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlspeed.core.algos.dqn import DQNSchedule, learning_rate_at
from rlspeed.core.algos.encoding import input_size, one_hot_classes, through_torso
from rlspeed.core.algos.loops.fused import (
    FusedTrainer,
    per_seed_sum,
    saved_agent_policies,
    scan_iterations,
)
from rlspeed.core.algos.loops.jax_learner import JaxLearner
from rlspeed.core.algos.networks.flax import MLP, apply_output, example_observations
from rlspeed.core.algos.replay import Batch, ReplayLearner, replay_buffer
from rlspeed.core.algos.replay_jax import (
    ReplayState,
    init_replay_state,
    jax_replay_sample,
    replay_step,
)
from rlspeed.core.algos.schedule import epsilon_at, multiples_between, polyak_weight
from rlspeed.core.envs.vmap import VmapEnv
from rlspeed.core.tasks import Policy
from rlspeed.seeding import JaxKeys

if TYPE_CHECKING:
    from flax.typing import VariableDict
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, XpArray


class Agent(NamedTuple):
    params: VariableDict
    target_params: VariableDict
    opt_state: optax.OptState


def epsilon_greedy(
    greedy: jax.Array, key: jax.Array, epsilon: jax.Array, n_actions: int
) -> jax.Array:
    """The ``greedy`` actions [B], each replaced with probability ``epsilon`` by a uniformly
    random one of ``n_actions`` (DQN's and PQN's exploration), as int32."""
    explore_key, action_key = jax.random.split(key)
    n = greedy.shape[0]
    explore = jax.random.uniform(explore_key, (n,)) < epsilon
    random = jax.random.randint(action_key, (n,), 0, n_actions, dtype=jnp.int32)
    return jnp.where(explore, random, greedy.astype(jnp.int32))


class DQNFunctions:
    """Pure functions of one DQN configuration: init, act, update, target sync."""

    def __init__(
        self, obs_space: spaces.Space[Any], action_space: spaces.Discrete, cfg: RunConfig
    ) -> None:
        algo = self.algo = cfg.algo
        self.n_actions = int(action_space.n)
        # Observations (through the conv torso where they are images) -> Q-value of every
        # action: hidden layers with ReLU.
        self.network = MLP(
            self.n_actions,
            tuple(algo.hidden_sizes),
            one_hot_classes(obs_space),
            nn.relu,
            torso=through_torso(obs_space, algo.network),
        )
        optimizer = optax.adam if algo.optimizer == "adam" else optax.sgd
        self.optimizer = optimizer(
            partial(learning_rate_at, algo=algo, total_steps=cfg.total_steps, num_envs=cfg.num_envs)
            if algo.anneal_lr
            else algo.learning_rate
        )
        self._dummy_obs = example_observations(obs_space)

    def init(self, key: jax.Array) -> Agent:
        params = self.network.init(key, self._dummy_obs)
        return Agent(params, params, self.optimizer.init(params))

    def act(
        self, params: VariableDict, obs: jax.Array, key: jax.Array, epsilon: jax.Array
    ) -> jax.Array:
        greedy = apply_output(self.network, params, obs).argmax(axis=1)
        return epsilon_greedy(greedy, key, epsilon, self.n_actions)

    def greedy(self, params: VariableDict, obs: jax.Array) -> jax.Array:
        actions: jax.Array = apply_output(self.network, params, obs).argmax(axis=1)
        return actions

    def td_targets(self, target_params: VariableDict, batch: Batch[jax.Array]) -> jax.Array:
        next_q = apply_output(self.network, target_params, batch.next_obs).max(axis=1)
        targets: jax.Array = batch.rewards + self.algo.gamma * next_q * (1.0 - batch.dones)
        return targets

    def update(
        self, agent: Agent, batch: Batch[jax.Array], td_target: jax.Array
    ) -> tuple[Agent, jax.Array, jax.Array]:

        def loss_fn(params: VariableDict) -> tuple[jax.Array, jax.Array]:
            q_all = apply_output(self.network, params, batch.obs)
            q = jnp.take_along_axis(q_all, batch.actions.astype(jnp.int32)[:, None], axis=1)[:, 0]
            return jnp.mean((q - td_target) ** 2), q.mean()

        (loss, q_mean), grads = jax.value_and_grad(loss_fn, has_aux=True)(agent.params)
        updates, opt_state = self.optimizer.update(grads, agent.opt_state, agent.params)
        params = optax.apply_updates(agent.params, updates)
        return Agent(params, agent.target_params, opt_state), loss, q_mean

    def learn(self, agent: Agent, batch: Batch[jax.Array]) -> tuple[Agent, jax.Array, jax.Array]:
        """One update on ``batch``, its TD targets from the target network."""
        return self.update(agent, batch, self.td_targets(agent.target_params, batch))

    def sync_target(self, agent: Agent, weight: jax.Array) -> Agent:
        """``target += weight * (online - target)``."""
        target = optax.incremental_update(agent.params, agent.target_params, weight)
        return agent._replace(target_params=target)


class FlaxLearner(JaxLearner, DQNSchedule, ReplayLearner):
    """Jitted act/update for the Python-driven loop (Gymnasium engines)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        self.algo, self.total_steps, self.num_envs = cfg.algo, cfg.total_steps, cfg.num_envs
        self.fns = DQNFunctions(obs_space, action_space, cfg)
        super().__init__(self.fns.init, seed)
        self._act = jax.jit(self.fns.act)
        self._greedy = jax.jit(self.fns.greedy)
        self._update = jax.jit(self.fns.learn)
        self._sync = jax.jit(self.fns.sync_target)
        self.buffer = replay_buffer(obs_space, action_space, cfg, seed)

    def act(self, obs: XpArray, step: int) -> jax.Array:
        actions: jax.Array = self._act(self.agent.params, obs, self.next_key(), self.epsilon(step))
        return actions

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._greedy(self.agent.params, obs))

    def update(self, batch: Batch[np.ndarray]) -> dict[str, jax.Array]:
        self.agent, loss, q_mean = self._update(self.agent, batch)
        return {"losses/td_loss": loss, "losses/q_values": q_mean}

    def sync_target(self, weight: float) -> None:
        self.agent = self._sync(self.agent, weight)

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the agent (networks, optimizer state) and its key (after the
        run's step counts, the config's, as resume files have always held them)."""
        return {"total_steps": self.total_steps, "num_envs": self.num_envs, **self.agent_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_agent_state(state)


# ---------------------------------------------------------------- fused jax-vmap path


# Most network inputs (transitions x input size) drawn at once for a group of fused
# updates. Kept within the CPU's caches: a group of CartPole's small batches (4 x 64 x 4
# inputs) runs 7% faster than one batch at a time, while Doors' 32 x 128 x 900 one-hot
# inputs at once ran 7% slower than one batch at a time (4.7 k vs 5.0 k env steps/s).
PRESAMPLE_INPUTS = 1 << 16


class ChunkStats(NamedTuple):
    """Per iteration of a chunk: finished episodes [iters, num_envs] and update stats [iters]."""

    done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    loss_sum: jax.Array
    q_sum: jax.Array
    n_updates: jax.Array
    epsilon: jax.Array


def make_train(cfg: RunConfig, env: VmapEnv) -> FusedTrainer:
    algo, n = cfg.algo, env.num_envs
    # DQN acts in Discrete spaces (its SPEC's action kinds: the checks see to it).
    action_space = cast("spaces.Discrete", env.single_action_space)
    fns = DQNFunctions(env.single_observation_space, action_space, cfg)
    total_iterations = math.ceil(cfg.total_steps / n)
    # Updates per group sharing one replay draw: all of an iteration's (at most
    # ceil(n / train_frequency)), up to PRESAMPLE_INPUTS network inputs.
    batch_inputs = algo.batch_size * input_size(env.single_observation_space)
    group_size = max(1, min(-(-n // algo.train_frequency), PRESAMPLE_INPUTS // batch_inputs))

    def init(keys: JaxKeys) -> ReplayState:
        return init_replay_state(fns.init(keys.init), keys, env, algo.buffer_size)

    def iteration(state: ReplayState, _: None) -> tuple[ReplayState, ChunkStats]:
        key, act_key, update_key = jax.random.split(state.key, 3)
        epsilon = epsilon_at(state.step, algo, cfg.total_steps, xp=jnp)
        actions = fns.act(state.agent.params, state.env.obs, act_key, epsilon)
        env_state, result, replay, step, n_updates = replay_step(env, state, actions, algo)

        # The agent, and its sums of the group's losses and mean Q-values.
        Sums = tuple[Agent, jax.Array, jax.Array]

        def update_group(group: jax.Array, carry: Sums) -> Sums:
            # The target network is fixed until the sync below, so the group's batches are
            # drawn at once and their TD targets come from one large matrix product.
            batches = jax_replay_sample(
                replay,
                jax.random.fold_in(update_key, group),
                group_size * algo.batch_size,
                env.num_envs,
            )
            td_targets = fns.td_targets(carry[0].target_params, batches)

            def one_update(batch: Batch[jax.Array], td_target: jax.Array, carry: Sums) -> Sums:
                agent, loss_sum, q_sum = carry
                agent, loss, q_mean = fns.update(agent, batch, td_target)
                return agent, loss_sum + loss, q_sum + q_mean

            if group_size == 1:  # used whole: slicing a lone batch cost Doors 10%
                return one_update(batches, td_targets, carry)
            grouped = jax.tree.map(
                lambda x: x.reshape(group_size, algo.batch_size, *x.shape[1:]),
                (batches, td_targets),
            )
            count = jnp.minimum(group_size, n_updates - group * group_size)

            def update_at(i: jax.Array, carry: Sums) -> Sums:
                batch, td_target = jax.tree.map(lambda x: x[i], grouped)
                return one_update(batch, td_target, carry)

            sums: Sums = jax.lax.fori_loop(0, count, update_at, carry)
            return sums

        agent, loss_sum, q_sum = jax.lax.fori_loop(
            0,
            -(-n_updates // group_size),
            update_group,
            (state.agent, jnp.float32(0), jnp.float32(0)),
        )
        syncs = multiples_between(
            state.step, step, algo.target_network_frequency, algo.learning_starts, jnp
        )
        agent = jax.lax.cond(
            syncs > 0,
            lambda a: fns.sync_target(a, polyak_weight(algo.tau, syncs)),
            lambda a: a,
            agent,
        )
        stats = ChunkStats(
            result.terminated | result.truncated,
            result.episode_return,
            result.episode_length,
            loss_sum,
            q_sum,
            n_updates,
            epsilon,
        )
        return ReplayState(agent, replay, env_state, key, step, state.updates + n_updates), stats

    def summarize(stats: ChunkStats) -> dict[str, np.ndarray]:
        metrics = {"charts/epsilon": np.asarray(stats.epsilon[:, -1], dtype=np.float64)}
        # Every seed follows the same update schedule: the counts are equal across seeds.
        n_updates = per_seed_sum(stats.n_updates)
        if n_updates.min() > 0:
            metrics["losses/td_loss"] = per_seed_sum(stats.loss_sum) / n_updates
            metrics["losses/q_values"] = per_seed_sum(stats.q_sum) / n_updates
        return metrics

    return FusedTrainer(
        init=init,
        run=scan_iterations(iteration),
        total_iterations=total_iterations,
        steps_per_iteration=n,
        policy_params=lambda state: state.agent.params,
        greedy=fns.greedy,
        summarize=summarize,
    )


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Discrete,
) -> list[Policy]:
    """The greedy policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    fns = DQNFunctions(obs_space, action_space, cfg)
    return saved_agent_policies(cfg, saved, fns.init, "params", fns.greedy)
