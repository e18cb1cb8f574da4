"""``env=jax-vmap``: a jitted ``jax.vmap`` of the task's functional JAX environment.

``VmapEnv`` holds the pure functions (``init``, ``step``) that fused training loops call
inside ``jit``/``lax.scan``; auto-reset, the time limit and episode statistics all happen
inside JAX. ``JaxVmapEngine`` drives the same functions from Python for the backends
that are not fused, exchanging arrays through DLPack (no copies on the same device).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rlspeed.engines import EngineSpec, StepResult


class VmapState(NamedTuple):
    env_state: Any  # batched functional-env state
    obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    key: jax.Array


class VmapEnv:
    """Pure, batched step/reset of a gymnasium ``FuncEnv`` with a time limit."""

    def __init__(self, func_env: Any, num_envs: int, max_episode_steps: int) -> None:
        self.func_env = func_env
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.single_observation_space = func_env.observation_space
        self.single_action_space = func_env.action_space

    def init(self, key: jax.Array) -> VmapState:
        key, reset_key = jax.random.split(key)
        env_state = jax.vmap(self.func_env.initial)(jax.random.split(reset_key, self.num_envs))
        obs = jax.vmap(self.func_env.observation)(env_state)
        zeros = jnp.zeros(self.num_envs)
        return VmapState(env_state, obs, zeros, zeros.astype(jnp.int32), key)

    def _step_one(
        self,
        env_state: Any,
        ep_return: jax.Array,
        ep_length: jax.Array,
        action: Any,
        key: jax.Array,
    ) -> tuple[Any, ...]:
        f = self.func_env
        step_key, reset_key = jax.random.split(key)
        next_state = f.transition(env_state, action, step_key)
        reward = f.reward(env_state, action, next_state, step_key).astype(jnp.float32)
        terminated = f.terminal(next_state)
        ep_return = ep_return + reward
        ep_length = ep_length + 1
        # Like gymnasium's TimeLimit: truncated once the limit is reached.
        truncated = ep_length >= self.max_episode_steps
        done = terminated | truncated
        final_obs = f.observation(next_state)
        reset_state = f.initial(reset_key)
        next_state = jax.tree.map(lambda r, n: jnp.where(done, r, n), reset_state, next_state)
        obs = jnp.where(done, f.observation(reset_state), final_obs)
        result = StepResult(obs, reward, terminated, truncated, final_obs, ep_return, ep_length)
        return next_state, jnp.where(done, 0.0, ep_return), jnp.where(done, 0, ep_length), result

    def step(self, state: VmapState, actions: jax.Array) -> tuple[VmapState, StepResult]:
        key, step_key = jax.random.split(state.key)
        keys = jax.random.split(step_key, self.num_envs)
        env_state, ep_return, ep_length, result = jax.vmap(self._step_one)(
            state.env_state, state.episode_return, state.episode_length, actions, keys
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
        self._state = self._init(jax.random.key(self._seed))
        return self._state.obs

    def step(self, actions: Any) -> StepResult:
        if not isinstance(actions, jax.Array):
            # torch tensors and NumPy arrays come in through DLPack, sharing memory.
            actions = jax.dlpack.from_dlpack(actions)
        self._state, result = self._step(self._state, actions)
        return result

    def close(self) -> None:
        self._state = None


def make_vmap_env(task: Any, task_cfg: Any, num_envs: int) -> VmapEnv:
    return VmapEnv(task.make_functional(task_cfg), num_envs, task_cfg.max_steps)


def make_engine(
    task: Any, task_cfg: Any, engine_cfg: Any, num_envs: int, seed: int
) -> JaxVmapEngine:
    return JaxVmapEngine(make_vmap_env(task, task_cfg, num_envs), seed)


SPEC = EngineSpec(name="jax-vmap", needs_functional_env=True, make=make_engine)
