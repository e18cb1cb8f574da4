"""HalfCheetah's JAX twin: Gymnasium's ``HalfCheetah-v5`` stepped by MuJoCo MJX (MuJoCo's
JAX port) as a :class:`FuncEnv` whose every method can be jitted and vmapped (``env=jax-vmap``).

The model, the frame skip, the reward weights and the reset noise are all read from the
registered v5 env, so the twin cannot drift from it; only the precision differs (MJX
computes in float32, MuJoCo in float64).
"""

from __future__ import annotations

import contextlib
import io
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from gymnasium.experimental.functional import FuncEnv

# mujoco-mjx prints "Failed to import warp" to stdout at import where NVIDIA Warp (its
# optional GPU backend, unused here) is not installed: it would land in a run's output.
with contextlib.redirect_stdout(io.StringIO()):
    from mujoco import mjx

if TYPE_CHECKING:
    from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv


class CheetahState(NamedTuple):
    """What carries over from one MuJoCo step to the next in this model (no activations, no
    mocap bodies, no applied forces)."""

    qpos: jax.Array  # float32 [9]: root x, z, angle, then the 6 joint angles
    qvel: jax.Array  # float32 [9]
    # The constraint solver's starting point, kept between steps as MuJoCo's mj_step does.
    qacc_warmstart: jax.Array  # float32 [9]


class HalfCheetahFunctional(
    FuncEnv[CheetahState, jax.Array, jax.Array, jax.Array, jax.Array, None, None]
):
    """``HalfCheetah-v5`` on MJX: never terminal, no time limit of its own (VmapEnv's)."""

    # Physics is deterministic: only the start state is random.
    transition_uses_rng = False

    def __init__(self, v5: HalfCheetahEnv) -> None:
        """``v5``: the unwrapped Gymnasium ``HalfCheetahEnv`` to copy."""
        super().__init__()
        self._model = mjx.put_model(v5.model)
        # A blank MJX data that each transition fills with the carried state.
        self._blank = mjx.make_data(self._model)
        self._qpos0 = jnp.asarray(v5.init_qpos, dtype=jnp.float32)
        self._qvel0 = jnp.asarray(v5.init_qvel, dtype=jnp.float32)
        self._frame_skip = v5.frame_skip
        self._dt = v5.dt  # timestep * frame_skip: 0.05 s
        self._forward_weight = v5._forward_reward_weight
        self._ctrl_weight = v5._ctrl_cost_weight
        self._noise = v5._reset_noise_scale
        # v5 observes float64; the twin's observations are float32, as MJX computes them.
        self.observation_space = spaces.Box(-np.inf, np.inf, v5.observation_space.shape, np.float32)
        self.action_space = v5.action_space

    def initial(self, rng: jax.Array, params: None = None) -> CheetahState:
        """v5's reset: qpos0 + U(-0.1, 0.1) on every coordinate, qvel0 + 0.1 N(0, 1)."""
        pos_key, vel_key = jax.random.split(rng)
        qpos = self._qpos0 + jax.random.uniform(
            pos_key, self._qpos0.shape, minval=-self._noise, maxval=self._noise
        )
        qvel = self._qvel0 + self._noise * jax.random.normal(vel_key, self._qvel0.shape)
        return CheetahState(qpos, qvel, jnp.zeros_like(qvel))

    def transition(
        self,
        state: CheetahState,
        action: jax.Array,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> CheetahState:
        """``frame_skip`` MuJoCo steps with the action as the controls (MuJoCo clamps them to
        the actuators' ctrlrange, as in v5)."""
        data = self._blank.replace(
            qpos=state.qpos, qvel=state.qvel, qacc_warmstart=state.qacc_warmstart, ctrl=action
        )
        data = jax.lax.fori_loop(0, self._frame_skip, lambda _, d: mjx.step(self._model, d), data)
        return CheetahState(data.qpos, data.qvel, data.qacc_warmstart)

    def observation(
        self, state: CheetahState, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        """qpos without the root's x, then qvel: 17 floats."""
        return jnp.concatenate([state.qpos[1:], state.qvel])

    def reward(
        self,
        state: CheetahState,
        action: jax.Array,
        next_state: CheetahState,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array:
        """Forward speed of the root over the step, less 0.1 * |action|^2 (the action as
        given, before MuJoCo's clamp)."""
        x_velocity = (next_state.qpos[0] - state.qpos[0]) / self._dt
        reward: jax.Array = self._forward_weight * x_velocity - self._ctrl_weight * jnp.sum(
            action * action
        )
        return reward

    def terminal(
        self, state: CheetahState, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        """v5 never terminates; episodes end at the time limit."""
        never: jax.Array = jnp.bool_(False)
        return never
