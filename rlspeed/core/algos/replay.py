"""The replay buffer on the host, and what DQN and TD3 do with it there: what both share on
every pairing but ``flax`` + ``jax-vmap`` (their JAX twin, for the fused programs:
``replay_jax.py``, which writes and draws by this module's ``write_plan`` and ``draw_slots``).

``ReplayBuffer`` is a NumPy ring buffer; ``ReplayLearner`` is the iteration both algorithms'
learners run under ``rlspeed.core.algos.loops.host.HostTraining`` (act, step, store, the updates
due).

Each observation is stored once. The envs add one transition each per step, in lockstep,
so env ``e``'s next transition sits ``num_envs`` slots after its last one and holds the
next observation. The buffer writes that observation there as soon as it is known (one
spare row of ``num_envs`` slots past ``capacity`` keeps it from overwriting a transition
still in use); the next step's write keeps it, or replaces it with a reset observation
where the episode ended. An episode that ended leaves no next observation in the next
slot: where it terminated, none is needed (the target does not bootstrap); where it was
truncated, its final observation goes to a ring of its own, sized by how many truncated
transitions the buffer can hold (``final_capacity``): a few where episodes end only at the
task's time limit, one per transition where the env may truncate them itself (``task=gym``).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar, cast

import numpy as np

from rlspeed.core.algos import check_memory, check_ranges
from rlspeed.core.algos.loops.host import Iteration
from rlspeed.core.algos.schedule import multiples_between, updates_in_run
from rlspeed.core.heap import HeapTrimmer
from rlspeed.core.state import check_shape, load_array, load_rng_state, rng_state
from rlspeed.errors import ConfigError
from rlspeed.registry import TASKS
from rlspeed.seeding import Stream, numpy_rng

if TYPE_CHECKING:
    from types import ModuleType

    import jax
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AnyArray, XpArray, XpArrayT
    from rlspeed.core.algos.loops.host import EpisodeSink
    from rlspeed.core.engines import Engine

    # A position in the buffer or a count of transitions: a Python int on the host, a JAX
    # one in the fused programs.
    Count = int | jax.Array


ArrayT = TypeVar("ArrayT")


class ReplaySettings(Protocol):
    """What ``check_replay`` reads of a replay-buffer algorithm's config (DQN's, TD3's)."""

    @property
    def buffer_size(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def train_frequency(self) -> int: ...
    @property
    def learning_starts(self) -> int: ...


def check_replay(algo: ReplaySettings, cfg: RunConfig, min_updates: int = 1) -> None:
    """What a replay-buffer algorithm (DQN, TD3) needs: a buffer that holds a batch and a step
    of every env, and a budget that reaches ``min_updates`` gradient updates (a run without
    any would end FINISHED having learned nothing). Its memory is checked too."""
    check_ranges(algo, count=("buffer_size", "batch_size", "train_frequency"))
    check_ranges(algo, steps=("learning_starts",))
    for key, value in (("algo.batch_size", algo.batch_size), ("num_envs", cfg.num_envs)):
        if value > algo.buffer_size:
            raise ConfigError(key, value, f"<= algo.buffer_size ({algo.buffer_size})")
    every, start, n = algo.train_frequency, algo.learning_starts, cfg.num_envs
    # Updates fall on multiples of train_frequency after learning_starts, and a run ends at
    # the first multiple of num_envs at or past total_steps.
    if updates_in_run(cfg.total_steps, n, every, start) < min_updates:
        last_needed = (start // every + min_updates) * every
        least = (math.ceil(last_needed / n) - 1) * n + 1
        what = "a gradient update" if min_updates == 1 else f"{min_updates} gradient updates"
        raise ConfigError(
            "total_steps",
            cfg.total_steps,
            f">= {least}, a budget with {what} (updates start after "
            f"algo.learning_starts={start}, one every algo.train_frequency={every} env steps)",
        )
    finals = final_capacity(algo.buffer_size, cfg.num_envs, truncation_gap(cfg))
    check_memory(cfg, ("algo.buffer_size", algo.buffer_size), observations=finals)


class Batch(NamedTuple, Generic[ArrayT]):
    """Sampled transitions: NumPy arrays from ``ReplayBuffer``, JAX arrays from
    ``jax_replay_sample``."""

    obs: ArrayT
    next_obs: ArrayT
    actions: ArrayT
    rewards: ArrayT
    dones: ArrayT  # 1.0 where the episode terminated (not merely truncated)


def final_capacity(capacity: int, num_envs: int, truncation_gap: int) -> int:
    """Room for the final observations of the truncated episodes among ``capacity``
    transitions, where an env is truncated at most once every ``truncation_gap`` steps:
    those transitions are at most ``ceil(capacity / num_envs)`` steps of each env, each
    env truncated at most once per gap, plus once for an episode the window cuts.

    The ring overwrites its oldest final observation first, so none still in use is lost
    while the ring holds every truncation the newest ``capacity`` transitions can have:
    with ``truncation_gap=1`` that is at least ``capacity``, whatever the pattern."""
    steps = -(-capacity // num_envs)
    return num_envs * (-(-steps // truncation_gap) + 1)


def truncation_gap(cfg: RunConfig) -> int:
    """The fewest steps between two truncations of one env of the run's task: its time
    limit where nothing else truncates an episode (the built-in tasks), else 1 (an env of
    ``task=gym`` may truncate at any step)."""
    return cfg.task.max_steps if TASKS.get(cfg.task.name).truncates_only_at_time_limit else 1


class WritePlan(NamedTuple):
    """Where one step's transitions go (NumPy or JAX integer arrays)."""

    slots: Any  # each env's transition
    pending: Any  # the slot after each: its next observation, until the next step's write
    # Each truncated env's final observation in the final ring, else past it (None: none kept).
    final_slots: Any
    final_index: Any  # per transition: that index, or -1 (its next slot holds it)
    position: Any  # the buffer's positions and size after the write
    final_position: Any
    size: Any


def write_plan(
    position: Count,
    final_position: Count,
    size: Count,
    truncated: XpArray,
    capacity: int,
    finals: int,
    xp: ModuleType,
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


def draw_slots(
    obs: XpArrayT,
    final_obs: XpArrayT,
    final_index: XpArrayT,
    position: Count,
    size: Count,
    draws: XpArrayT,
    num_envs: int,
    xp: ModuleType,
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
    ``num_envs`` envs, each truncated at most once every ``truncation_gap`` steps."""

    # Its arrays of a slot each, as its resume state names them (with final_obs, of a kept
    # final observation each).
    SLOT_ARRAYS = ("obs", "final_index", "actions", "rewards", "dones")

    def __init__(
        self,
        capacity: int,
        obs_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        rng: np.random.Generator,
        num_envs: int,
        truncation_gap: int,
    ) -> None:
        self.capacity, self.num_envs = capacity, num_envs
        slots = capacity + num_envs
        # Never None: gymnasium types every space's shape as optional, for the spaces
        # without one (Dict, Tuple), which no algorithm takes.
        obs_shape, action_shape = (
            cast("tuple[int, ...]", space.shape) for space in (obs_space, action_space)
        )
        # Float observations as float32, what every network reads: a MuJoCo env's float64
        # would double the buffer's memory and its resume file for the same values.
        stored = np.float32 if np.issubdtype(obs_space.dtype, np.floating) else obs_space.dtype
        self.obs = np.zeros((slots, *obs_shape), dtype=stored)
        finals = final_capacity(capacity, num_envs, truncation_gap)
        self.final_obs = np.zeros((finals, *obs_shape), dtype=stored)
        self.final_index = np.full(slots, -1, dtype=np.int64)
        self.actions = np.zeros((slots, *action_shape), dtype=action_space.dtype)
        self.rewards = np.zeros(slots, dtype=np.float32)
        self.dones = np.zeros(slots, dtype=np.float32)
        self.size = self.position = self.final_position = 0
        self._rng = rng

    def add(
        self,
        obs: XpArray,
        next_obs: XpArray,
        actions: AnyArray,
        rewards: XpArray,
        terminated: XpArray,
        truncated: XpArray,
    ) -> None:
        """Store a step's transitions, one per env (arrays of any CPU library);
        ``next_obs``: the observation each step ended in (the final one at an episode's
        end)."""
        terminated, next_obs = np.asarray(terminated), np.asarray(next_obs)
        kept = np.asarray(truncated) & ~terminated
        plan = self._in_slices(kept) or write_plan(
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
        if plan.final_slots is not None:
            self.final_obs[plan.final_slots[kept]] = next_obs[kept]
        self.final_index[plan.slots] = plan.final_index
        self.actions[plan.slots] = np.asarray(actions)
        self.rewards[plan.slots] = np.asarray(rewards)
        self.dones[plan.slots] = terminated
        self.position, self.final_position, self.size = (
            int(x) for x in (plan.position, plan.final_position, plan.size)
        )

    def _in_slices(self, kept: np.ndarray) -> WritePlan | None:
        """``write_plan``'s plan as slices, for the common step: no final observation to
        keep, and this step's slots and the ones after them run on without wrapping. None
        for any other step. With one env, its index arrays cost ten times the step's writes."""
        n, start = self.num_envs, self.position
        if start + 2 * n > len(self.obs) or kept.any():
            return None
        return WritePlan(
            slice(start, start + n),
            slice(start + n, start + 2 * n),
            None,
            -1,
            start + n,
            self.final_position,
            min(self.size + n, self.capacity),
        )

    def sample(self, batch_size: int) -> Batch[np.ndarray]:
        draws = self._rng.integers(0, self.size, size=batch_size)
        slots, next_obs = draw_slots(
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

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the arrays as far as they are written (a buffer filled to a
        tenth is saved as a tenth, not at its capacity), the positions in them, the
        generator batches are drawn with, and the capacity and number of envs (the
        config's, as resume files have always held them). The arrays are views of the
        buffer's own: write them before it changes."""
        slots, finals = self._lengths()
        written = {name: getattr(self, name)[:slots] for name in self.SLOT_ARRAYS}
        return {
            "capacity": self.capacity,
            "num_envs": self.num_envs,
            **written,
            "final_obs": self.final_obs[:finals],
            "size": self.size,
            "position": self.position,
            "final_position": self.final_position,
            "_rng": rng_state(self._rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put a saved buffer back: its arrays whole, or as far as ``state_dict`` writes them
        for its positions (the rest is then as built); any other length is a ValueError."""
        self.size, self.position, self.final_position = (
            int(state[name]) for name in ("size", "position", "final_position")
        )
        slots = int(state["capacity"]) + int(state["num_envs"])
        written_slots, written_finals = self._lengths()
        for name in (*self.SLOT_ARRAYS, "final_obs"):
            saved, array = state[name], getattr(self, name)
            full = slots if name != "final_obs" else len(array)
            written = written_slots if name != "final_obs" else written_finals
            if len(saved) not in (full, written):
                check_shape(name, np.shape(saved), array.shape)
            check_shape(name, (full, *np.shape(saved)[1:]), array.shape)
            load_array(name, array[: len(saved)], saved)
            array[len(saved) :] = -1 if name == "final_index" else 0
        load_rng_state(self._rng, state["_rng"])

    def _lengths(self) -> tuple[int, int]:
        """Slots and final-observation slots written so far (``written_lengths``)."""
        return written_lengths(
            self.size, self.position, self.final_position, len(self.obs), self.num_envs,
            len(self.final_obs),
        )  # fmt: skip


def written_lengths(
    size: int, position: int, final_position: int, slots: int, num_envs: int, finals: int
) -> tuple[int, int]:
    """How much of a buffer of ``slots`` slots (its capacity and ``num_envs`` more) and
    ``finals`` final-observation slots is written, the host's and the fused path's alike:
    the slots up to the next step's observations until the buffer first fills
    (``write_plan`` writes them ``num_envs`` slots ahead), then every slot; the final
    observations up to ``final_position`` while no more have been kept than there are slots
    for them (at most one per transition, and the buffer has not filled: fewer transitions
    than ``position`` so far), else every slot."""
    if size < slots - num_envs:
        return position + num_envs, (final_position if position <= finals else finals)
    return slots, finals


def replay_buffer(
    obs_space: spaces.Space[Any], action_space: spaces.Space[Any], cfg: RunConfig, seed: int
) -> ReplayBuffer:
    """A host-driven learner's buffer: the last ``algo.buffer_size`` transitions of the
    run's envs, its batches drawn from the seed's own stream (``Stream.REPLAY``)."""
    return ReplayBuffer(
        cfg.algo.buffer_size,
        obs_space,
        action_space,
        numpy_rng(seed, Stream.REPLAY),
        cfg.num_envs,
        truncation_gap(cfg),
    )


class ReplayLearner:
    """What DQN's and TD3's learners share on the host: a replay buffer, which a resume
    continues from (``carried``), and the iteration ``HostTraining`` runs, CleanRL's: act,
    step every env once, store the transitions, then one gradient update every
    ``train_frequency`` env steps after ``learning_starts``, each on a batch drawn from
    the buffer. Step counts are env steps, whatever ``num_envs`` is.

    A learner sets ``algo`` and ``buffer`` (``replay_buffer``) and defines, in its
    algorithm's file, ``act`` (collect) and ``update`` (targets, loss, gradient step), and
    may define ``episodes_ended`` (TD3: its exploration noise) and ``after_env_steps``
    (DQN: its target syncs and exploration rate)."""

    algo: Any
    buffer: ReplayBuffer

    @functools.cached_property
    def heap(self) -> HeapTrimmer:
        """Gives the memory the updates freed back now and then (``rlspeed.core.heap``)."""
        return HeapTrimmer()

    @property
    def carried(self) -> dict[str, Any]:
        """The parts of a resume besides the learner (named as resume files name them)."""
        return {"buffer": self.buffer}

    def act(self, obs: XpArray, step: int) -> AnyArray:
        """Exploratory actions at env step ``step`` for a batch of observations
        (engine-native arrays in, arrays the engine takes out)."""
        raise NotImplementedError

    def update(self, batch: Batch[np.ndarray]) -> dict[str, Any]:
        """One gradient step; its metrics as backend scalars (averaged per log interval)."""
        raise NotImplementedError

    def episodes_ended(self, ended: np.ndarray) -> None:
        """Bookkeeping where the episodes of the envs flagged in ``ended`` (bool [num_envs])
        ended with this step (TD3: its OU exploration noise starts afresh)."""

    def after_env_steps(self, prev_step: int, step: int) -> dict[str, float]:
        """Bookkeeping once the env steps ``prev_step`` -> ``step`` are stored and learned
        from (e.g. a periodic target-network sync); returns schedule values to log."""
        return {}

    def iteration(
        self, engine: Engine, obs: XpArray, step: int, episodes: EpisodeSink
    ) -> Iteration:
        """One env step of every env from env step ``step``, and what is due after it."""
        algo = self.algo
        # Collect: act, step, store the transitions (the final observation where one ended).
        actions = self.act(obs, step)
        result = engine.step(actions)
        self.buffer.add(
            obs, result.final_obs, actions, result.reward, result.terminated, result.truncated
        )
        ended = np.asarray(result.terminated) | np.asarray(result.truncated)
        if ended.any():  # most steps end none: nothing to hand over
            episodes.episodes(ended, result.episode_return, result.episode_length)
            self.episodes_ended(ended)
        # Learn: the updates due, each on a fresh batch from the buffer.
        end = step + engine.num_envs
        due = int(multiples_between(step, end, algo.train_frequency, algo.learning_starts))
        metrics = [self.update(self.buffer.sample(algo.batch_size)) for _ in range(due)]
        self.heap.updated(due)
        latest = self.after_env_steps(step, end)
        return Iteration(result.obs, engine.num_envs, due, metrics, latest)
