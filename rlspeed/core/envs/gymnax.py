"""A gymnax environment (a built-in, or a user's in gymnax's interface) as rlspeed runs it: a
functional twin for ``env=jax-vmap`` (``GymnaxTwin``), which the Gymnasium engines step
behind the face any twin has (``rlspeed.core.envs.gym_face``), so that one env compares
across every stack.

The semantics are the same on every stack:

- the twin steps gymnax's ``step_env`` and ``reset_env``, never its auto-resetting ``step``:
  rlspeed's engines reset an ended env themselves and keep its final observation, which the
  algorithms bootstrap from at a truncation;
- ``terminated`` is gymnax's natural end of an episode (no bootstrap); the time limit is
  rlspeed's ``task.max_steps``, which the twin also writes into the env's params as
  ``max_steps_in_episode``, so that the env's own limit and rlspeed's are one (a truncation,
  which bootstraps);
- Box observations are float32 (MinAtar's and Catch's 0/1 grids too), Discrete ones int32,
  rewards float32 scalars.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces as gymnax_spaces

if TYPE_CHECKING:
    from gymnax.environments.environment import Environment, EnvParams

    from rlspeed.core import PyTree


class GymnaxState(NamedTuple):
    """The twin's state: gymnax's, with what its last step gave (gymnax returns them from
    ``step_env`` at once, where a functional env asks for each on its own)."""

    env: PyTree
    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array


def gymnasium_space(space: gymnax_spaces.Space, observations: bool) -> gym.Space[Any]:
    """A gymnax space as Gymnasium's: gymnax's own conversion, with observation Boxes as
    float32 (the twin casts its observations so)."""
    converted: gym.Space[Any] = gymnax_spaces.gymnax_space_to_gym_space(space)
    if observations and isinstance(converted, gym.spaces.Box):
        low, high = (np.asarray(bound, np.float32) for bound in (converted.low, converted.high))
        return gym.spaces.Box(low, high, converted.shape, np.float32)
    return converted


def env_spaces(
    env: Environment[Any, Any], params: EnvParams
) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """The env's observation and action spaces at ``params``, as Gymnasium's."""
    observations = gymnasium_space(env.observation_space(params), True)
    return observations, gymnasium_space(env.action_space(params), False)


def param_kinds(env: Environment[Any, Any], params: EnvParams) -> dict[str, str]:
    """Each env param's name and kind: ``traced`` for one that can be an input of the
    compiled program (a float scalar the spaces do not depend on: a program's shapes and
    bounds are fixed), else ``int`` or ``constant``, compiled into it (a grid's size, a
    bound of the observations)."""
    spaces = env_spaces(env, params)
    kinds = {}
    for name, value in vars(params).items():
        floating = isinstance(value, float) or (
            isinstance(value, jax.Array | np.ndarray)
            and value.ndim == 0
            and jnp.issubdtype(value.dtype, jnp.floating)
        )
        if floating and env_spaces(env, params.replace(**{name: value * 2 + 1})) == spaces:
            kinds[name] = "traced"
        elif isinstance(value, int) or np.issubdtype(np.asarray(value).dtype, np.integer):
            kinds[name] = "int"
        else:
            kinds[name] = "constant"
    return kinds


class GymnaxTwin:
    """gymnax's ``reset_env``/``step_env`` of one env and its params as the functional env
    ``rlspeed.core.envs.vmap.VmapEnv`` steps (``FunctionalEnv``)."""

    def __init__(
        self,
        env: Environment[Any, Any],
        params: EnvParams,
        spaces: tuple[gym.Space[Any], gym.Space[Any]] | None = None,
    ) -> None:
        self.env, self.params = env, params
        if spaces is None:
            # Built eagerly: gymnax computes some bounds with jax.numpy, and a twin may be
            # made while a program is traced (the fused path's on-device scores).
            with jax.ensure_compile_time_eval():
                spaces = env_spaces(env, params)
        self.observation_space, self.action_space = spaces
        self._obs_dtype = self.observation_space.dtype

    def with_params(self, values: dict[str, jax.Array]) -> GymnaxTwin:
        """This twin with env params ``values`` in place of its own, which may be tracers
        (the fused program's inputs): only params its spaces do not depend on, whose spaces
        it keeps (``param_kinds``)."""
        spaces = (self.observation_space, self.action_space)
        return GymnaxTwin(self.env, self.params.replace(**values), spaces)

    def _observed(self, obs: jax.Array) -> jax.Array:
        return jnp.asarray(obs).astype(self._obs_dtype)

    def initial(self, rng: jax.Array, params: None = None) -> GymnaxState:
        obs, state = self.env.reset_env(rng, self.params)
        no = jnp.zeros((), bool)
        return GymnaxState(state, self._observed(obs), jnp.zeros((), jnp.float32), no)

    def transition(
        self,
        state: GymnaxState,
        action: jax.Array,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> GymnaxState:
        obs, following, reward, terminated, _ = self.env.step_env(
            rng, state.env, action, self.params
        )
        reward = jnp.asarray(reward, jnp.float32).reshape(())
        ended = jnp.asarray(terminated, bool).reshape(())
        return GymnaxState(following, self._observed(obs), reward, ended)

    def observation(
        self, state: GymnaxState, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        return state.obs

    def reward(
        self,
        state: GymnaxState,
        action: jax.Array,
        next_state: GymnaxState,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array:
        return next_state.reward

    def terminal(
        self, state: GymnaxState, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        return state.terminated
