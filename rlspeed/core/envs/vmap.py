"""Batched functional environments for ``env=jax-vmap``: a jitted ``jax.vmap`` of a task's
functional JAX twin.

``VmapEnv`` holds the pure functions (``init``, ``step``) that fused training loops call
inside ``jit``/``lax.scan``; auto-reset, the time limit and episode statistics all happen
inside JAX. ``JaxVmapEngine`` drives the same functions from Python for the backends
that are not fused, exchanging arrays through DLPack (no copies on the same device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from rlspeed.core.engines import StepResult
from rlspeed.core.state import tree_from_host, tree_to_host
from rlspeed.seeding import Stream, jax_key

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import TaskConfig
    from rlspeed.core import AnyArray, PyTree


class FunctionalEnv(Protocol):
    """A task's functional JAX twin as ``VmapEnv`` steps it: a gymnasium ``FuncEnv`` of JAX
    observations, actions, rewards and terminal flags, its state a pytree of its own, every
    method pure (jitted, vmapped). ``rng``: the method's key, None where the twin says the
    method draws nothing (``transition_uses_rng`` or ``initial_uses_rng`` False), so that
    ``VmapEnv`` draws no key for it. A twin may also define ``initial_batch(key,
    num_envs)``: every env's start state at once."""

    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]

    def initial(self, rng: jax.Array, params: None = None) -> PyTree: ...

    def transition(
        self, state: PyTree, action: jax.Array, rng: jax.Array | None = None, params: None = None
    ) -> PyTree: ...

    def observation(
        self, state: PyTree, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array: ...

    def reward(
        self,
        state: PyTree,
        action: jax.Array,
        next_state: PyTree,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array: ...

    def terminal(
        self, state: PyTree, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array: ...


class VmapState(NamedTuple):
    env_state: PyTree  # batched functional-env state
    obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    key: jax.Array


# The envs' own random stream. Philox draws 4-5x more words per second than JAX's default
# threefry on XLA:CPU, and every env step draws for every env (its resets).
ENV_PRNG = "philox4x32"


def env_stream(key: jax.Array) -> jax.Array:
    """A key of the ``ENV_PRNG`` kind, derived from any JAX key."""
    data_shape = jax.random.key_data(jax.random.key(0, impl=ENV_PRNG)).shape
    bits = jax.random.bits(key, data_shape, jnp.uint32)
    env_key: jax.Array = jax.random.wrap_key_data(bits, impl=ENV_PRNG)
    return env_key


class VmapEnv:
    """Pure, batched step/reset of a gymnasium ``FuncEnv`` with a time limit."""

    def __init__(self, func_env: FunctionalEnv, num_envs: int, max_episode_steps: int) -> None:
        self.func_env = func_env
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.single_observation_space = func_env.observation_space
        self.single_action_space = func_env.action_space
        # Per-env keys cost more than a whole Doors step on XLA:CPU (threefry, ~14 ns per
        # word), so none are drawn for methods that ignore theirs. A functional env says so
        # with these attributes; one that does not say gets keys everywhere.
        self._transition_rng = getattr(func_env, "transition_uses_rng", True)
        self._initial_rng = getattr(func_env, "initial_uses_rng", True)

    def init(self, key: jax.Array) -> VmapState:
        key = env_stream(key)
        key, reset_key = jax.random.split(key)
        env_state = self._initial_states(reset_key)
        obs = jax.vmap(self.func_env.observation)(env_state)
        zeros = jnp.zeros(self.num_envs)
        return VmapState(env_state, obs, zeros, zeros.astype(jnp.int32), key)

    def _initial_states(self, key: jax.Array) -> PyTree:
        """A start state for every env (batched). A functional env may draw them all at
        once with ``initial_batch(key, num_envs)``: one call to the random generator for
        every env costs far less than a key per env (Doors at 512 envs: 29 M -> 33 M steps/s)."""
        f = self.func_env
        if hasattr(f, "initial_batch"):
            return f.initial_batch(key, self.num_envs)
        if not self._initial_rng:
            # No key: the twin says its start draws nothing (``initial_uses_rng``).
            start = f.initial(None)  # type: ignore[arg-type]
            return jax.tree.map(lambda x: jnp.broadcast_to(x, (self.num_envs, *x.shape)), start)
        return jax.vmap(f.initial)(jax.random.split(key, self.num_envs))

    def _step_one(
        self,
        env_state: PyTree,
        ep_return: jax.Array,
        ep_length: jax.Array,
        action: jax.Array,
        step_key: jax.Array | None,
        reset_state: PyTree,
    ) -> tuple[Any, ...]:
        f = self.func_env
        next_state = f.transition(env_state, action, step_key)
        reward = f.reward(env_state, action, next_state, step_key).astype(jnp.float32)
        terminated = f.terminal(next_state)
        ep_return = ep_return + reward
        ep_length = ep_length + 1
        # Like gymnasium's TimeLimit: truncated once the limit is reached.
        truncated = ep_length >= self.max_episode_steps
        done = terminated | truncated
        final_obs = f.observation(next_state)
        next_state = jax.tree.map(lambda r, n: jnp.where(done, r, n), reset_state, next_state)
        # Observing the selected state, not selecting between two observations: Doors'
        # observation is a 225-cell grid, and memory traffic bounds its step.
        obs = f.observation(next_state)
        result = StepResult(obs, reward, terminated, truncated, final_obs, ep_return, ep_length)
        return next_state, jnp.where(done, 0.0, ep_return), jnp.where(done, 0, ep_length), result

    def step(self, state: VmapState, actions: jax.Array) -> tuple[VmapState, StepResult]:
        key, step_key, reset_key = jax.random.split(state.key, 3)
        step_keys = jax.random.split(step_key, self.num_envs) if self._transition_rng else None
        env_state, ep_return, ep_length, result = jax.vmap(self._step_one)(
            state.env_state,
            state.episode_return,
            state.episode_length,
            actions,
            step_keys,
            self._initial_states(reset_key),
        )
        return VmapState(env_state, result.obs, ep_return, ep_length, key), result


class JaxVmapEngine:
    """Host-side driver of ``VmapEnv`` with the common engine interface."""

    def __init__(self, vmap_env: VmapEnv, seed: int) -> None:
        self.functions = vmap_env
        self.num_envs = vmap_env.num_envs
        self.single_observation_space = vmap_env.single_observation_space
        self.single_action_space = vmap_env.single_action_space
        self._seed = seed
        self._init = jax.jit(vmap_env.init)
        self._step = jax.jit(vmap_env.step)
        self._state: VmapState | None = None

    def reset(self) -> jax.Array:
        # The same env stream as the fused path's (rlspeed.seeding.jax_keys).
        self._state = self._init(jax_key(self._seed, Stream.ENV))
        return self._state.obs

    def step(self, actions: AnyArray) -> StepResult:
        assert self._state is not None, "reset() before step()"
        if not isinstance(actions, jax.Array):
            # torch tensors and NumPy arrays come in through DLPack, sharing memory, then go
            # where the envs are (a no-op when both are on one device).
            actions = jax.dlpack.from_dlpack(actions)
            actions = jax.device_put(actions, self._state.obs.device)
        result: StepResult
        self._state, result = self._step(self._state, actions)
        return result

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the envs' batched state (their observations, episodes so far
        and key among it), and the number of envs and the seed, the config's, as resume
        files have always held them."""
        if self._state is None:
            raise ValueError("the engine holds no envs' state (not reset, or closed)")
        return {"num_envs": self.num_envs, "_seed": self._seed, "_state": tree_to_host(self._state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the saved envs' state back, into the shapes a ``reset`` made."""
        if self._state is None:
            raise ValueError("reset() before load_state_dict()")
        self._state = tree_from_host(self._state, state["_state"])

    def close(self) -> None:
        self._state = None


def greedy_episodes(
    func_env: FunctionalEnv,
    states: PyTree,
    act: Callable[[jax.Array], jax.Array],
    max_steps: int,
    key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One episode from each of the batched start ``states`` of a functional env, acted on
    by ``act`` (observations -> actions, traceable), to its end or ``max_steps`` at most:
    (returns [B], lengths [B]). ``key``: the transitions' random stream, for an env whose
    transition draws (``transition_uses_rng``). Traceable and vmappable (over agents'
    parameters), so the fused path scores every seed in one program."""
    observe = jax.vmap(func_env.observation)
    transition, reward = jax.vmap(func_env.transition), jax.vmap(func_env.reward)
    terminal = jax.vmap(func_env.terminal)
    batch = len(jax.tree.leaves(states)[0])

    def running(carry: tuple[Any, ...]) -> jax.Array:
        going: jax.Array = carry[1].any() & (carry[4] < max_steps)
        return going

    def step(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        state, alive, returns, lengths, t = carry
        actions = act(observe(state))
        keys = None
        if key is not None and getattr(func_env, "transition_uses_rng", True):
            keys = jax.random.split(jax.random.fold_in(key, t), batch)
        following = transition(state, actions, keys)
        rewards = reward(state, actions, following, None).astype(jnp.float32)
        returns = returns + jnp.where(alive, rewards, 0.0)
        lengths = lengths + alive
        state = jax.tree.map(
            lambda n, s: jnp.where(alive.reshape(-1, *[1] * (n.ndim - 1)), n, s), following, state
        )
        return state, alive & ~terminal(following), returns, lengths, t + 1

    alive = jnp.ones(batch, dtype=bool)
    start = (states, alive, jnp.zeros(batch), jnp.zeros(batch, dtype=jnp.int32), 0)
    _, _, returns, lengths, _ = jax.lax.while_loop(running, step, start)
    return returns, lengths


def mean_greedy_return(
    env: VmapEnv, act: Callable[[jax.Array], jax.Array], key: jax.Array
) -> jax.Array:
    """Mean return of one episode per env of ``env``, from the start states of
    ``env.init(key)``, each to its end or the env's time limit (``greedy_episodes``)."""
    start = env.init(key)
    returns, _ = greedy_episodes(
        env.func_env, start.env_state, act, env.max_episode_steps, start.key
    )
    return returns.mean()


class FunctionalTask(Protocol):
    """What ``make_vmap_env`` reads of its task, a ``rlspeed.core.tasks.TaskSpec``, which is
    not imported here: rlspeed.core.tasks imports this module (a task's device evaluation
    runs on VmapEnv)."""

    # The task's functional JAX twin of these settings; None for a task without one.
    @property
    def make_functional(self) -> Callable[[TaskConfig], FunctionalEnv] | None: ...


def make_vmap_env(task: FunctionalTask, task_cfg: TaskConfig, num_envs: int) -> VmapEnv:
    # Never None here: the checks offer jax-vmap only tasks with a twin (needs_functional_env).
    return VmapEnv(task.make_functional(task_cfg), num_envs, task_cfg.max_steps)  # type: ignore[misc]
