"""The replay buffer in JAX, for the fused programs of DQN and TD3 (``flax`` + ``jax-vmap``):
the ring buffer of ``replay.py`` as pure functions of JAX arrays (``JaxReplay``), laid out,
written and drawn from as the host's is (its ``write_plan`` and ``draw_slots``), and the
train state (``ReplayState``) and env step (``replay_step``) both programs scan. JAX is
imported only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

from rlspeed.core.algos.replay import (
    Batch,
    draw_slots,
    final_capacity,
    write_plan,
    written_lengths,
)
from rlspeed.core.algos.schedule import multiples_between

if TYPE_CHECKING:
    import jax
    from gymnasium import spaces

    from rlspeed.core import PyTree
    from rlspeed.core.engines import StepResult
    from rlspeed.core.envs.vmap import VmapEnv, VmapState
    from rlspeed.seeding import JaxKeys


class JaxReplay(NamedTuple):
    """The ring buffer as a pytree of JAX arrays (carried through ``lax.scan``), laid out
    as ``ReplayBuffer``'s."""

    obs: Any
    final_obs: Any
    final_index: Any
    actions: Any
    rewards: Any
    dones: Any
    position: Any
    final_position: Any
    size: Any

    def written(self, num_envs: int) -> JaxReplay:
        """The buffer as far as it is written (``written_lengths``), what a resume file
        keeps, as the host buffer's ``state_dict`` does. Its arrays have a leading axis per
        lane or none; lanes step in lockstep, so one cut fits them all."""
        import jax
        import numpy as np

        lead = np.ndim(self.size)
        slots, finals = self.obs.shape[lead], self.final_obs.shape[lead]
        size, position, final_position = (
            int(np.max(jax.device_get(x))) for x in (self.size, self.position, self.final_position)
        )
        written, kept = written_lengths(size, position, final_position, slots, num_envs, finals)

        def cut(array: Any, length: int) -> Any:
            return array[(slice(None),) * lead + (slice(0, length),)]

        return self._replace(
            obs=cut(self.obs, written),
            final_obs=cut(self.final_obs, kept),
            final_index=cut(self.final_index, written),
            actions=cut(self.actions, written),
            rewards=cut(self.rewards, written),
            dones=cut(self.dones, written),
        )


def jax_replay_init(
    capacity: int,
    obs_space: spaces.Space[Any],
    action_space: spaces.Space[Any],
    num_envs: int,
    truncation_gap: int,
) -> JaxReplay:
    """An empty buffer of ``capacity`` transitions of ``num_envs`` envs, each truncated at
    most once every ``truncation_gap`` steps (``final_capacity``)."""
    import jax
    import jax.numpy as jnp

    # JAX's own width of each dtype (float64 -> float32 unless x64 is enabled).
    obs_dtype, action_dtype = (
        jax.dtypes.canonicalize_dtype(space.dtype) for space in (obs_space, action_space)
    )
    slots = capacity + num_envs
    finals = final_capacity(capacity, num_envs, truncation_gap)
    # Never None: gymnasium types every space's shape as optional, for the spaces without one
    # (Dict, Tuple), which no algorithm takes.
    obs_shape, action_shape = (
        cast("tuple[int, ...]", space.shape) for space in (obs_space, action_space)
    )
    return JaxReplay(
        obs=jnp.zeros((slots, *obs_shape), obs_dtype),
        final_obs=jnp.zeros((finals, *obs_shape), obs_dtype),
        final_index=jnp.full(slots, -1, jnp.int32),
        actions=jnp.zeros((slots, *action_shape), action_dtype),
        rewards=jnp.zeros(slots, jnp.float32),
        dones=jnp.zeros(slots, jnp.float32),
        position=jnp.int32(0),
        final_position=jnp.int32(0),
        size=jnp.int32(0),
    )


def jax_replay_add(
    replay: JaxReplay,
    obs: jax.Array,
    next_obs: jax.Array,
    actions: jax.Array,
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
) -> JaxReplay:
    """Store one transition per env (pure: returns the new buffer); as ``ReplayBuffer.add``."""
    import jax.numpy as jnp

    n = rewards.shape[0]
    capacity = replay.obs.shape[0] - n
    kept = truncated & ~terminated
    plan = write_plan(
        replay.position,
        replay.final_position,
        replay.size,
        kept,
        capacity,
        replay.final_obs.shape[0],
        jnp,
    )
    return JaxReplay(
        replay.obs.at[plan.slots].set(obs).at[plan.pending].set(next_obs),
        replay.final_obs.at[plan.final_slots].set(next_obs, mode="drop"),
        replay.final_index.at[plan.slots].set(plan.final_index.astype(jnp.int32)),
        replay.actions.at[plan.slots].set(actions.astype(replay.actions.dtype)),
        replay.rewards.at[plan.slots].set(rewards),
        replay.dones.at[plan.slots].set(terminated.astype(jnp.float32)),
        plan.position.astype(jnp.int32),
        plan.final_position.astype(jnp.int32),
        plan.size.astype(jnp.int32),
    )


def jax_replay_sample(
    replay: JaxReplay, key: jax.Array, batch_size: int, num_envs: int
) -> Batch[jax.Array]:
    """A uniform batch (with replacement) of the stored transitions."""
    import jax
    import jax.numpy as jnp

    draws = jax.random.randint(key, (batch_size,), 0, replay.size)
    slots, next_obs = draw_slots(
        replay.obs,
        replay.final_obs,
        replay.final_index,
        replay.position,
        replay.size,
        draws,
        num_envs,
        jnp,
    )
    return Batch(
        replay.obs[slots],
        next_obs,
        replay.actions[slots],
        replay.rewards[slots],
        replay.dones[slots],
    )


class ReplayState(NamedTuple):
    """The train state of a fused replay-buffer algorithm (DQN, TD3)."""

    agent: PyTree
    replay: JaxReplay
    env: VmapState
    key: jax.Array
    step: jax.Array
    updates: jax.Array
    # The actor's exploration noise carried between steps (TD3's OU noise); () for none.
    noise: PyTree = ()


def init_replay_state(agent: PyTree, keys: JaxKeys, env: VmapEnv, buffer_size: int) -> ReplayState:
    """A fresh agent with an empty replay buffer, at env step 0."""
    import jax.numpy as jnp

    # A VmapEnv truncates an episode at its time limit and nowhere else.
    replay = jax_replay_init(
        buffer_size,
        env.single_observation_space,
        env.single_action_space,
        env.num_envs,
        env.max_episode_steps,
    )
    return ReplayState(agent, replay, env.init(keys.env), keys.act, jnp.int32(0), jnp.int32(0))


class UpdateSchedule(Protocol):
    """What ``replay_step`` reads of an algorithm's config (DQN's, TD3's)."""

    @property
    def train_frequency(self) -> int: ...
    @property
    def learning_starts(self) -> int: ...


def replay_step(
    env: VmapEnv, state: ReplayState, actions: jax.Array, algo: UpdateSchedule
) -> tuple[VmapState, StepResult, JaxReplay, jax.Array, jax.Array]:
    """Step every env with ``actions`` and store the transitions, as ``ReplayLearner`` does
    on the host: (env state, step result, replay buffer, env steps then, gradient updates
    due)."""
    import jax.numpy as jnp

    env_state, result = env.step(state.env, actions)
    replay = jax_replay_add(
        state.replay,
        state.env.obs,
        result.final_obs,
        actions,
        result.reward,
        result.terminated,
        result.truncated,
    )
    step = state.step + env.num_envs
    n_updates = multiples_between(state.step, step, algo.train_frequency, algo.learning_starts, jnp)
    return env_state, result, replay, step, n_updates
