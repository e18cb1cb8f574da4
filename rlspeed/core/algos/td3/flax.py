"""TD3 in Flax + Optax.

``TD3Functions`` holds the pure functions. With a Gymnasium engine ``FlaxLearner`` calls
them jitted, under ``rlspeed.core.algos.loops.host.HostTraining``: each iteration
(``ReplayLearner.iteration``, shared with DQN) collects with ``act`` into the replay buffer,
then learns with ``update`` as often as due. With ``env=jax-vmap`` everything is fused:
``make_train`` builds pure functions in which acting, stepping, storing and updating run
inside one ``lax.scan`` with the replay buffer in JAX arrays (driven by
``rlspeed/core/algos/loops/fused.py``).
The twin critics are one parameter pytree stacked on a leading axis of 2, evaluated
with ``jax.vmap``. SAC's learner and fused program are these (``ActorCriticLearner``,
``actor_critic_program``) with its own functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlspeed.core.algos.loops.fused import (
    FusedTrainer,
    per_seed_sum,
    saved_agent_policies,
    scan_iterations,
)
from rlspeed.core.algos.loops.jax_learner import JaxLearner
from rlspeed.core.algos.networks.flax import apply_output
from rlspeed.core.algos.replay import Batch, ReplayLearner, replay_buffer
from rlspeed.core.algos.replay_jax import (
    ReplayState,
    init_replay_state,
    jax_replay_sample,
    replay_step,
)
from rlspeed.core.algos.td3 import (
    DelayedActor,
    TD3Config,
    action_bounds,
    draw_noise,
    explore,
    is_actor_step,
    restart_noise,
    smoothed_target_actions,
    squash,
    uniform_actions,
)
from rlspeed.core.envs.vmap import VmapEnv
from rlspeed.core.state import tree_from_host, tree_to_host
from rlspeed.core.tasks import Policy
from rlspeed.seeding import JaxKeys

if TYPE_CHECKING:
    from flax.typing import VariableDict
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, PyTree, XpArray


# The exploration noise an actor carries from step to step, per env: with OU exploration
# TD3's noise or SAC's draws [num_envs, *action_shape], or () where each step's are drawn
# afresh (Gaussian exploration).
Noise = jax.Array | tuple[()]


def _flat(obs: jax.Array) -> jax.Array:
    return obs.reshape(obs.shape[0], -1).astype(jnp.float32)


class Actor(nn.Module):
    """Deterministic policy before the tanh squashing (see ``TD3Functions.actor``)."""

    action_dim: int
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = _flat(obs)
        for size in self.hidden_sizes:
            x = nn.relu(nn.Dense(size)(x))
        return nn.Dense(self.action_dim)(x)


class QNetwork(nn.Module):
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, actions: jax.Array) -> jax.Array:
        x = jnp.concatenate([_flat(obs), actions.astype(jnp.float32)], axis=1)
        for size in self.hidden_sizes:
            x = nn.relu(nn.Dense(size)(x))
        return nn.Dense(1)(x)[:, 0]


class Agent(NamedTuple):
    actor_params: VariableDict
    critic_params: VariableDict  # Q1 and Q2, stacked on a leading axis of 2
    actor_target: VariableDict
    critic_target: VariableDict
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState


def critic_step(
    critics: Callable[[VariableDict, jax.Array, jax.Array], jax.Array],
    optimizer: optax.GradientTransformation,
    params: VariableDict,
    opt_state: optax.OptState,
    batch: Batch[jax.Array],
    target: jax.Array,
) -> tuple[VariableDict, optax.OptState, jax.Array, jax.Array]:
    """One step of the twin critics' (``critics``: Q1 and Q2 stacked) regression onto
    ``target`` [B], TD3's and SAC's alike: the new parameters and optimizer state, and each
    critic's loss and mean value [2]."""

    def loss_fn(params: VariableDict) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        q = critics(params, batch.obs, batch.actions)
        losses = jnp.mean((q - target) ** 2, axis=1)
        return losses.sum(), (losses, q.mean(axis=1))

    (_, (losses, q_means)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, losses, q_means


class ActorCriticFunctions(Protocol):
    """The pure functions of an actor-critic replay algorithm (TD3's, SAC's) that its host
    learner (``ActorCriticLearner``) and fused program (``actor_critic_program``) call. The
    agent is a NamedTuple whose field ``actor_params`` holds what ``actor`` and ``act``
    take."""

    @property
    def algo(self) -> DelayedActor: ...
    @property
    def metric_names(self) -> tuple[str, ...]:
        """Every metric ``update`` returns."""
        ...

    @property
    def actor_metrics(self) -> tuple[str, ...]:
        """Those of them only an actor step computes (0 on the other updates)."""
        ...

    def init(self, key: jax.Array) -> Any: ...
    def init_noise(self, num_envs: int) -> Noise:
        """The exploration noise of ``num_envs`` envs at the start."""
        ...

    def actor(self, params: VariableDict, obs: jax.Array) -> jax.Array:
        """The greedy actions."""
        ...

    def act(
        self, params: VariableDict, obs: jax.Array, key: jax.Array, step: jax.Array, noise: Noise
    ) -> tuple[jax.Array, Noise]:
        """Exploratory actions at env step ``step``, and the noise carried to the next."""
        ...

    def noise(self, key: jax.Array, actions_shape: tuple[int, ...]) -> jax.Array:
        """The standard-normal draws of one update on a batch of ``actions_shape``."""
        ...

    def update(
        self, agent: PyTree, batch: Batch[jax.Array], noise: jax.Array, actor_step: jax.Array
    ) -> tuple[PyTree, dict[str, jax.Array]]:
        """One critic update, and the actor's where ``actor_step``."""
        ...


class TD3Functions:
    """Pure functions of one TD3 configuration: init, act, and the update."""

    metric_names = ("losses/qf1_loss", "losses/qf2_loss", "losses/qf1_values", "losses/actor_loss")
    actor_metrics = ("losses/actor_loss",)

    def __init__(self, obs_space: spaces.Box, action_space: spaces.Box, algo: TD3Config) -> None:
        self.algo = algo
        self.bounds = action_bounds(action_space, jnp.asarray)
        self.action_shape = tuple(action_space.shape)
        hidden = tuple(algo.hidden_sizes)
        self.actor_net = Actor(int(np.prod(action_space.shape)), hidden)
        self.critic_net = QNetwork(hidden)
        self.optimizer = optax.adam(algo.learning_rate)
        self._dummy_obs = jnp.zeros((1, *obs_space.shape), jnp.float32)
        self._dummy_actions = jnp.zeros((1, *action_space.shape), jnp.float32)

    def init(self, key: jax.Array) -> Agent:
        actor_key, critic_key = jax.random.split(key)
        actor = self.actor_net.init(actor_key, self._dummy_obs)
        critics = jax.vmap(self.critic_net.init, in_axes=(0, None, None))(
            jax.random.split(critic_key), self._dummy_obs, self._dummy_actions
        )
        opt = self.optimizer
        return Agent(actor, critics, actor, critics, opt.init(actor), opt.init(critics))

    def init_noise(self, num_envs: int) -> Noise:
        """OU noise starts at 0; Gaussian noise carries nothing between steps."""
        if self.algo.exploration == "ou":
            return jnp.zeros((num_envs, *self.action_shape), jnp.float32)
        return ()

    def actor(self, params: VariableDict, obs: jax.Array) -> jax.Array:
        """The deterministic (greedy) actions."""
        actions: jax.Array = squash(apply_output(self.actor_net, params, obs), self.bounds, jnp)
        return actions

    def critics(self, params: VariableDict, obs: jax.Array, actions: jax.Array) -> jax.Array:
        """Q1 and Q2 of each (obs, action): shape [2, B]."""
        critic = partial(apply_output, self.critic_net)
        return jax.vmap(critic, in_axes=(0, None, None))(params, obs, actions)

    def act(
        self, params: VariableDict, obs: jax.Array, key: jax.Array, step: jax.Array, noise: Noise
    ) -> tuple[jax.Array, Noise]:
        """Uniformly random actions before ``learning_starts``, then the actor's plus noise;
        OU noise moves from ``learning_starts`` on (it stays at 0 until then)."""
        noise_key, random_key = jax.random.split(key)
        actions = self.actor(params, obs)
        normal = jax.random.normal(noise_key, actions.shape)
        drawn, moved = draw_noise(noise, normal, self.algo)
        noisy = explore(actions, drawn, self.bounds, jnp)
        random = uniform_actions(jax.random.uniform(random_key, actions.shape), self.bounds)
        learning = step >= self.algo.learning_starts
        noise = jax.tree.map(lambda new, old: jnp.where(learning, new, old), moved, noise)
        return jnp.where(learning, noisy, random), noise

    def noise(self, key: jax.Array, actions_shape: tuple[int, ...]) -> jax.Array:
        """Target policy smoothing's draws: one per action entry."""
        return jax.random.normal(key, actions_shape)

    def update_critics(
        self, agent: Agent, batch: Batch[jax.Array], target_noise: jax.Array
    ) -> tuple[Agent, dict[str, jax.Array]]:
        algo = self.algo
        next_actions = smoothed_target_actions(
            self.actor(agent.actor_target, batch.next_obs), target_noise, self.bounds, algo, jnp
        )
        next_q = self.critics(agent.critic_target, batch.next_obs, next_actions).min(axis=0)
        target = batch.rewards + algo.gamma * (1.0 - batch.dones) * next_q
        params, opt_state, losses, q_means = critic_step(
            self.critics, self.optimizer, agent.critic_params, agent.critic_opt_state, batch, target
        )
        agent = agent._replace(critic_params=params, critic_opt_state=opt_state)
        metrics = {
            "losses/qf1_loss": losses[0],
            "losses/qf2_loss": losses[1],
            "losses/qf1_values": q_means[0],
        }
        return agent, metrics

    def update_actor(self, agent: Agent, batch: Batch[jax.Array]) -> tuple[Agent, jax.Array]:
        """The delayed step: the actor ascends Q1, then every target moves by ``tau``."""
        q1_params = jax.tree.map(lambda x: x[0], agent.critic_params)

        def loss_fn(params: VariableDict) -> jax.Array:
            actions = self.actor(params, batch.obs)
            return -apply_output(self.critic_net, q1_params, batch.obs, actions).mean()

        loss, grads = jax.value_and_grad(loss_fn)(agent.actor_params)
        updates, opt_state = self.optimizer.update(grads, agent.actor_opt_state, agent.actor_params)
        actor = optax.apply_updates(agent.actor_params, updates)
        tau = self.algo.tau
        agent = Agent(
            actor,
            agent.critic_params,
            optax.incremental_update(actor, agent.actor_target, tau),
            optax.incremental_update(agent.critic_params, agent.critic_target, tau),
            opt_state,
            agent.critic_opt_state,
        )
        return agent, loss

    def update(
        self, agent: Agent, batch: Batch[jax.Array], target_noise: jax.Array, actor_step: jax.Array
    ) -> tuple[Agent, dict[str, jax.Array]]:
        """One critic update, and the actor's where ``actor_step`` (actor_loss 0 elsewhere)."""
        agent, metrics = self.update_critics(agent, batch, target_noise)
        agent, metrics["losses/actor_loss"] = jax.lax.cond(
            actor_step, self.update_actor, lambda a, b: (a, jnp.float32(0.0)), agent, batch
        )
        return agent, metrics


class ActorCriticLearner(JaxLearner, ReplayLearner):
    """Jitted act/update of an actor-critic algorithm's ``functions`` for the Python-driven
    loop (Gymnasium engines)."""

    functions: Callable[[spaces.Box, spaces.Box, Any], ActorCriticFunctions]

    def __init__(
        self, obs_space: spaces.Box, action_space: spaces.Box, cfg: RunConfig, seed: int
    ) -> None:
        self.algo = cfg.algo
        self.fns = type(self).functions(obs_space, action_space, cfg.algo)
        super().__init__(self.fns.init, seed)
        self.updates = 0
        self.noise = self.fns.init_noise(cfg.num_envs)
        self._act = jax.jit(self.fns.act)
        self._greedy = jax.jit(self.fns.actor)
        self._update = jax.jit(self.fns.update)
        self._noise = jax.jit(self.fns.noise, static_argnums=1)
        self.buffer = replay_buffer(obs_space, action_space, cfg, seed)

    def act(self, obs: XpArray, step: int) -> jax.Array:
        actions: jax.Array
        actions, self.noise = self._act(
            self.agent.actor_params, obs, self.next_key(), step, self.noise
        )
        return actions

    def episodes_ended(self, ended: np.ndarray) -> None:
        flags = jnp.asarray(ended)
        self.noise = jax.tree.map(lambda noise: restart_noise(noise, flags), self.noise)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._greedy(self.agent.actor_params, obs))

    def update(
        self, batch: Batch[np.ndarray], noise: XpArray | None = None
    ) -> dict[str, jax.Array]:
        """One critic update, plus the actor's every ``policy_frequency``. ``noise``: the
        update's standard-normal draws (``fns.noise``; drawn here unless given)."""
        if noise is None:
            noise = self._noise(self.next_key(), batch.actions.shape)
        self.updates += 1
        actor_step = bool(is_actor_step(self.updates, self.algo))
        metrics: dict[str, jax.Array]
        self.agent, metrics = self._update(self.agent, batch, noise, actor_step)
        if not actor_step:
            for name in self.fns.actor_metrics:
                del metrics[name]
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the agent, its key, the update count (which says when the
        actor learns) and the exploration noise."""
        noise = tree_to_host(self.noise)
        return {**self.agent_state(), "updates": self.updates, "noise": noise}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_agent_state(state)
        self.updates = state["updates"]
        # Resume files from before OU exploration hold no noise: Gaussian noise carries none.
        self.noise = tree_from_host(self.noise, state.get("noise", []))


class FlaxLearner(ActorCriticLearner):
    functions = TD3Functions


# ---------------------------------------------------------------- fused jax-vmap path


class ChunkStats(NamedTuple):
    """Per iteration of a chunk: finished episodes [iters, num_envs] and update stats [iters]."""

    done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    loss_sums: dict[str, jax.Array]  # each metric summed over the iteration's updates
    n_updates: jax.Array
    n_actor_updates: jax.Array


def box_spaces(env: VmapEnv) -> tuple[spaces.Box, spaces.Box]:
    """The env's observation and action spaces, Boxes (TD3's and SAC's SPECs take no other
    kinds: the checks see to it)."""
    return cast("spaces.Box", env.single_observation_space), cast(
        "spaces.Box", env.single_action_space
    )


def make_train(cfg: RunConfig, env: VmapEnv) -> FusedTrainer:
    return actor_critic_program(cfg, env, TD3Functions(*box_spaces(env), cfg.algo))


def actor_critic_program(cfg: RunConfig, env: VmapEnv, fns: ActorCriticFunctions) -> FusedTrainer:
    """The fused program of an actor-critic replay algorithm: act, step, store, then the
    updates due, each on a fresh batch with fresh noise."""
    algo, n = cfg.algo, env.num_envs
    total_iterations = math.ceil(cfg.total_steps / n)

    def init(keys: JaxKeys) -> ReplayState:
        state = init_replay_state(fns.init(keys.init), keys, env, algo.buffer_size)
        return state._replace(noise=fns.init_noise(n))

    def iteration(state: ReplayState, _: None) -> tuple[ReplayState, ChunkStats]:
        key, act_key, update_key = jax.random.split(state.key, 3)
        actions, noise = fns.act(
            state.agent.actor_params, state.env.obs, act_key, state.step, state.noise
        )
        env_state, result, replay, step, n_updates = replay_step(env, state, actions, algo)
        ended = result.terminated | result.truncated
        noise = jax.tree.map(lambda carried: restart_noise(carried, ended), noise)

        def one_update(
            i: jax.Array, carry: tuple[Agent, dict[str, jax.Array]]
        ) -> tuple[Agent, dict[str, jax.Array]]:
            agent, sums = carry
            sample_key, noise_key = jax.random.split(jax.random.fold_in(update_key, i))
            batch = jax_replay_sample(replay, sample_key, algo.batch_size, env.num_envs)
            noise = fns.noise(noise_key, batch.actions.shape)
            actor_step = is_actor_step(state.updates + i + 1, algo)
            agent, metrics = fns.update(agent, batch, noise, actor_step)
            return agent, jax.tree.map(jnp.add, sums, metrics)

        zeros = dict.fromkeys(fns.metric_names, jnp.float32(0.0))
        agent, sums = jax.lax.fori_loop(0, n_updates, one_update, (state.agent, zeros))
        updates = state.updates + n_updates
        stats = ChunkStats(
            ended,
            result.episode_return,
            result.episode_length,
            sums,
            n_updates,
            updates // algo.policy_frequency - state.updates // algo.policy_frequency,
        )
        return ReplayState(agent, replay, env_state, key, step, updates, noise), stats

    def summarize(stats: ChunkStats) -> dict[str, np.ndarray]:
        # Every seed follows the same update schedule: the counts are equal across seeds.
        metrics = {}
        counts = dict.fromkeys(fns.actor_metrics, per_seed_sum(stats.n_actor_updates))
        for name, values in stats.loss_sums.items():
            count = counts.get(name, per_seed_sum(stats.n_updates))
            if count.min() > 0:
                metrics[name] = per_seed_sum(values) / count
        return metrics

    return FusedTrainer(
        init=init,
        run=scan_iterations(iteration),
        total_iterations=total_iterations,
        steps_per_iteration=n,
        policy_params=lambda state: state.agent.actor_params,
        greedy=fns.actor,
        summarize=summarize,
    )


def load_policies(
    cfg: RunConfig, saved: AgentCheckpoint, obs_space: spaces.Box, action_space: spaces.Box
) -> list[Policy]:
    """The deterministic policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    fns = TD3Functions(obs_space, action_space, cfg.algo)
    return saved_agent_policies(cfg, saved, fns.init, "actor_params", fns.actor)
