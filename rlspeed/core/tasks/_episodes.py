"""Shared by the tasks built on Gymnasium's registered envs: greedy evaluation episodes, and
the adapter that fits Gymnasium's functional JAX twins to their registered envs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.experimental.functional import FuncEnv

from rlspeed.core.tasks import Policy
from rlspeed.errors import EnvCode
from rlspeed.seeding import eval_seeds

if TYPE_CHECKING:
    import jax

    from rlspeed.core import PyTree


def mean_greedy_return(
    make_env: Callable[[], gym.Env], policy: Policy, episodes: int, seed: int
) -> float:
    """Mean return of ``policy`` over ``episodes`` episodes of the run with seed ``seed``,
    reset with its evaluation seeds (held out from its training envs' seeds).

    The envs step in lockstep with one batched policy call per step. Each env plays exactly
    one episode: once it has ended it is no longer stepped (no auto-reset) and its last
    observation stays in the batch, so the batch shape never changes.
    """
    envs = [make_env() for _ in range(episodes)]
    name = envs[0].spec.id if envs[0].spec is not None else type(envs[0].unwrapped).__name__
    seeds = eval_seeds(seed, episodes)
    with EnvCode(name, "evaluation episodes"):
        obs = np.stack([env.reset(seed=s)[0] for s, env in zip(seeds, envs, strict=True)])
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    while running.any():
        actions = np.asarray(policy(obs))
        with EnvCode(name, "evaluation episodes"):
            for i in np.flatnonzero(running):
                obs[i], reward, terminated, truncated, _ = envs[i].step(actions[i])
                returns[i] += float(reward)
                running[i] = not (terminated or truncated)
    with EnvCode(name, "close after evaluation episodes"):
        for env in envs:
            env.close()
    return float(returns.mean())


# Gymnasium's phys2d twins, whatever their state, observation, action and params types.
AnyFuncEnv = FuncEnv[Any, Any, Any, Any, Any, Any, Any]


class FunctionalTwin(AnyFuncEnv):
    """A Gymnasium functional JAX env fitted to its registered env, for ``VmapEnv``.

    It takes the registered env's observation and action spaces (Gymnasium's ``phys2d``
    twins declare unbounded observation spaces), uses ``params`` unless a call passes its
    own, and makes ``rng`` optional everywhere (the ``phys2d`` twins require it in
    ``observation`` and ``terminal``, where ``VmapEnv`` passes none).
    """

    # The phys2d dynamics are deterministic: only the start state is random (VmapEnv).
    transition_uses_rng = False

    def __init__(self, env: AnyFuncEnv, params: PyTree, registered: gym.Env) -> None:
        self._env = env
        self._params = params
        self.observation_space = registered.observation_space
        self.action_space = registered.action_space
        super().__init__()

    def get_default_params(self, **kwargs: object) -> PyTree:
        return self._params

    def initial(self, rng: jax.Array, params: PyTree | None = None) -> Any:
        return self._env.initial(rng, params or self.default_params)

    def transition(
        self,
        state: PyTree,
        action: jax.Array,
        rng: jax.Array | None = None,
        params: PyTree | None = None,
    ) -> Any:
        return self._env.transition(state, action, rng, params or self.default_params)

    def observation(
        self, state: PyTree, rng: jax.Array | None = None, params: PyTree | None = None
    ) -> Any:
        return self._env.observation(state, rng, params or self.default_params)

    def reward(
        self,
        state: PyTree,
        action: jax.Array,
        next_state: PyTree,
        rng: jax.Array | None = None,
        params: PyTree | None = None,
    ) -> Any:
        return self._env.reward(state, action, next_state, rng, params or self.default_params)

    def terminal(
        self, state: PyTree, rng: jax.Array | None = None, params: PyTree | None = None
    ) -> Any:
        return self._env.terminal(state, rng, params or self.default_params)
