"""The replay buffer, and what DQN and TD3 do with it on either path.

On the host (every pairing but ``flax`` + ``jax-vmap``): ``ReplayBuffer``, a NumPy ring
buffer, and ``ReplayLearner``, the iteration both algorithms' learners run under
``rlspeed.algos.loops.host.train_host`` (act, step, store, the updates due). In a fused
``lax.scan`` loop: the same buffer as pure functions of JAX arrays (``JaxReplay``), and the
train state (``ReplayState``) and env step (``replay_step``) of DQN's and TD3's fused
programs. JAX is imported only when called, so torch runs never load it.

Each observation is stored once. The envs add one transition each per step, in lockstep,
so env ``e``'s next transition sits ``num_envs`` slots after its last one and holds the
next observation. The buffer writes that observation there as soon as it is known (one
spare row of ``num_envs`` slots past ``capacity`` keeps it from overwriting a transition
still in use); the next step's write keeps it, or replaces it with a reset observation
where the episode ended. An episode that ended leaves no next observation in the next
slot: where it terminated, none is needed (the target does not bootstrap); where it was
truncated, its final observation goes to a small ring of its own (``final_capacity``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from rlspeed.algos.loops.host import Iteration
from rlspeed.algos.schedule import multiples_between
from rlspeed.seeding import Stream, numpy_rng

if TYPE_CHECKING:
    import jax

    from rlspeed.config import RunConfigLike
    from rlspeed.engines import Engine, StepResult
    from rlspeed.envs.vmap import VmapEnv, VmapState
    from rlspeed.monitor import SeedMonitor
    from rlspeed.seeding import JaxKeys


ArrayT = TypeVar("ArrayT")


class Batch(NamedTuple, Generic[ArrayT]):
    """Sampled transitions: NumPy arrays from ``ReplayBuffer``, JAX arrays from
    ``jax_replay_sample``."""

    obs: ArrayT
    next_obs: ArrayT
    actions: ArrayT
    rewards: ArrayT
    dones: ArrayT  # 1.0 where the episode terminated (not merely truncated)


def final_capacity(capacity: int, num_envs: int, max_steps: int) -> int:
    """Room for the final observations of the truncated episodes among ``capacity``
    transitions: those are at most ``ceil(capacity / num_envs)`` steps of each env, and an
    env is truncated at most once every ``max_steps`` steps (its time limit); one more per
    env for an episode the window cuts."""
    steps = -(-capacity // num_envs)
    return num_envs * (-(-steps // max_steps) + 1)


class WritePlan(NamedTuple):
    """Where one step's transitions go (NumPy or JAX integer arrays)."""

    slots: Any  # each env's transition
    pending: Any  # the slot after each: its next observation, until the next step's write
    final_slots: Any  # each truncated env's final observation in the final ring, else past it
    final_index: Any  # per transition: that index, or -1 (its next slot holds it)
    position: Any  # the buffer's positions and size after the write
    final_position: Any
    size: Any


def _plan(
    position: Any,
    final_position: Any,
    size: Any,
    truncated: Any,
    capacity: int,
    finals: int,
    xp: Any,
) -> WritePlan:
    """The write of one step; ``truncated``: the envs whose final observation must be kept
    (truncated and not terminated)."""
    n = truncated.shape[0]
    total = capacity + n
    slots = (position + xp.arange(n)) % total
    final = (final_position + xp.cumsum(truncated) - 1) % finals
    return WritePlan(
        slots,
        (slots + n) % total,
        xp.where(truncated, final, finals),
        xp.where(truncated, final, -1),
        (position + n) % total,
        (final_position + truncated.sum()) % finals,
        xp.minimum(size + n, capacity),
    )


def _draw(
    obs: Any,
    final_obs: Any,
    final_index: Any,
    position: Any,
    size: Any,
    draws: Any,
    num_envs: int,
    xp: Any,
) -> tuple[Any, Any]:
    """The slots of ``draws`` (integers in [0, size), oldest first among the ``size``
    newest transitions) and their next observations."""
    total = obs.shape[0]
    slots = (position - size + draws) % total
    index = final_index[slots]
    kept = (index >= 0).reshape(index.shape + (1,) * (obs.ndim - 1))
    return slots, xp.where(kept, final_obs[index], obs[(slots + num_envs) % total])


class ReplayBuffer:
    """The host-driven learners' buffer of the last ``capacity`` transitions of
    ``num_envs`` envs whose episodes last at most ``max_steps`` steps."""

    def __init__(
        self,
        capacity: int,
        obs_space: Any,
        action_space: Any,
        rng: np.random.Generator,
        num_envs: int,
        max_steps: int,
    ) -> None:
        self.capacity, self.num_envs = capacity, num_envs
        slots = capacity + num_envs
        self.obs = np.zeros((slots, *obs_space.shape), dtype=obs_space.dtype)
        finals = final_capacity(capacity, num_envs, max_steps)
        self.final_obs = np.zeros((finals, *obs_space.shape), dtype=obs_space.dtype)
        self.final_index = np.full(slots, -1, dtype=np.int64)
        self.actions = np.zeros((slots, *action_space.shape), dtype=action_space.dtype)
        self.rewards = np.zeros(slots, dtype=np.float32)
        self.dones = np.zeros(slots, dtype=np.float32)
        self.size = self.position = self.final_position = 0
        self._rng = rng

    def add(
        self,
        obs: Any,
        next_obs: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
    ) -> None:
        """Store a step's transitions, one per env (arrays of any CPU library);
        ``next_obs``: the observation each step ended in (the final one at an episode's
        end)."""
        terminated, next_obs = np.asarray(terminated), np.asarray(next_obs)
        kept = np.asarray(truncated) & ~terminated
        plan = _plan(
            self.position,
            self.final_position,
            self.size,
            kept,
            self.capacity,
            len(self.final_obs),
            np,
        )
        self.obs[plan.slots] = np.asarray(obs)
        self.obs[plan.pending] = next_obs
        self.final_obs[plan.final_slots[kept]] = next_obs[kept]
        self.final_index[plan.slots] = plan.final_index
        self.actions[plan.slots] = np.asarray(actions)
        self.rewards[plan.slots] = np.asarray(rewards)
        self.dones[plan.slots] = terminated
        self.position, self.final_position, self.size = (
            int(x) for x in (plan.position, plan.final_position, plan.size)
        )

    def sample(self, batch_size: int) -> Batch[np.ndarray]:
        draws = self._rng.integers(0, self.size, size=batch_size)
        slots, next_obs = _draw(
            self.obs,
            self.final_obs,
            self.final_index,
            self.position,
            self.size,
            draws,
            self.num_envs,
            np,
        )
        return Batch(
            self.obs[slots], next_obs, self.actions[slots], self.rewards[slots], self.dones[slots]
        )


def replay_buffer(obs_space: Any, action_space: Any, cfg: RunConfigLike, seed: int) -> ReplayBuffer:
    """A host-driven learner's buffer: the last ``algo.buffer_size`` transitions of the
    run's envs, its batches drawn from the seed's own stream (``Stream.REPLAY``)."""
    return ReplayBuffer(
        cfg.algo.buffer_size,
        obs_space,
        action_space,
        numpy_rng(seed, Stream.REPLAY),
        cfg.num_envs,
        cfg.task.max_steps,
    )


class ReplayLearner:
    """What DQN's and TD3's learners share on the host: a replay buffer, which a resume
    continues from (``carried``), and the iteration ``train_host`` runs, CleanRL's: act,
    step every env once, store the transitions, then one gradient update every
    ``train_frequency`` env steps after ``learning_starts``, each on a batch drawn from
    the buffer. Step counts are env steps, whatever ``num_envs`` is.

    A learner sets ``algo`` and ``buffer`` (``replay_buffer``) and defines, in its
    algorithm's file, ``act`` (collect) and ``update`` (targets, loss, gradient step), and
    may define ``after_env_steps`` (DQN: its target syncs and exploration rate)."""

    algo: Any
    buffer: ReplayBuffer

    @property
    def carried(self) -> dict[str, Any]:
        """The parts of a resume besides the learner (named as resume files name them)."""
        return {"buffer": self.buffer}

    def act(self, obs: Any, step: int) -> Any:
        """Exploratory actions at env step ``step`` for a batch of observations
        (engine-native arrays in, arrays the engine takes out)."""
        raise NotImplementedError

    def update(self, batch: Batch) -> dict[str, Any]:
        """One gradient step; its metrics as backend scalars (averaged per log interval)."""
        raise NotImplementedError

    def after_env_steps(self, prev_step: int, step: int) -> dict[str, float]:
        """Bookkeeping once the env steps ``prev_step`` -> ``step`` are stored and learned
        from (e.g. a periodic target-network sync); returns schedule values to log."""
        return {}

    def iteration(self, engine: Engine, obs: Any, step: int, episodes: SeedMonitor) -> Iteration:
        """One env step of every env from env step ``step``, and what is due after it."""
        algo = self.algo
        # Collect: act, step, store the transitions (the final observation where one ended).
        actions = self.act(obs, step)
        result = engine.step(actions)
        self.buffer.add(
            obs, result.final_obs, actions, result.reward, result.terminated, result.truncated
        )
        episodes.episodes(
            np.asarray(result.terminated) | np.asarray(result.truncated),
            result.episode_return,
            result.episode_length,
        )
        # Learn: the updates due, each on a fresh batch from the buffer.
        end = step + engine.num_envs
        due = int(multiples_between(step, end, algo.train_frequency, algo.learning_starts))
        metrics = [self.update(self.buffer.sample(algo.batch_size)) for _ in range(due)]
        latest = self.after_env_steps(step, end)
        return Iteration(result.obs, engine.num_envs, due, metrics, latest)


# ---------------------------------------------------------------- fused jax-vmap path


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


def jax_replay_init(
    capacity: int, obs_space: Any, action_space: Any, num_envs: int, max_steps: int
) -> JaxReplay:
    import jax
    import jax.numpy as jnp

    # JAX's own width of each dtype (float64 -> float32 unless x64 is enabled).
    obs_dtype, action_dtype = (
        jax.dtypes.canonicalize_dtype(space.dtype) for space in (obs_space, action_space)
    )
    slots = capacity + num_envs
    finals = final_capacity(capacity, num_envs, max_steps)
    return JaxReplay(
        obs=jnp.zeros((slots, *obs_space.shape), obs_dtype),
        final_obs=jnp.zeros((finals, *obs_space.shape), obs_dtype),
        final_index=jnp.full(slots, -1, jnp.int32),
        actions=jnp.zeros((slots, *action_space.shape), action_dtype),
        rewards=jnp.zeros(slots, jnp.float32),
        dones=jnp.zeros(slots, jnp.float32),
        position=jnp.int32(0),
        final_position=jnp.int32(0),
        size=jnp.int32(0),
    )


def jax_replay_add(
    replay: JaxReplay,
    obs: Any,
    next_obs: Any,
    actions: Any,
    rewards: Any,
    terminated: Any,
    truncated: Any,
) -> JaxReplay:
    """Store one transition per env (pure: returns the new buffer); as ``ReplayBuffer.add``."""
    import jax.numpy as jnp

    n = rewards.shape[0]
    capacity = replay.obs.shape[0] - n
    kept = truncated & ~terminated
    plan = _plan(
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
    replay: JaxReplay, key: Any, batch_size: int, num_envs: int
) -> Batch[jax.Array]:
    """A uniform batch (with replacement) of the stored transitions."""
    import jax
    import jax.numpy as jnp

    draws = jax.random.randint(key, (batch_size,), 0, replay.size)
    slots, next_obs = _draw(
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

    agent: Any
    replay: JaxReplay
    env: VmapState
    key: jax.Array
    step: jax.Array
    updates: jax.Array


def init_replay_state(agent: Any, keys: JaxKeys, env: VmapEnv, buffer_size: int) -> ReplayState:
    """A fresh agent with an empty replay buffer, at env step 0."""
    import jax.numpy as jnp

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
