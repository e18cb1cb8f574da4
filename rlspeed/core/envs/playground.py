"""A MuJoCo Playground environment (``mujoco_playground``'s ``MjxEnv``: its DM Control suite)
as the functional env ``rlspeed.core.envs.vmap.VmapEnv`` steps: ``PlaygroundTwin``.

The semantics are rlspeed's, not Playground's training wrappers':

- the twin calls the env's own ``reset`` and ``step``, never the wrappers that cut an
  episode at its ``episode_length`` or reset it inside the env: rlspeed's engines reset an
  ended env themselves and keep its final observation;
- ``terminated`` is the env's own ``done`` (in the DM Control suite: the physics went NaN);
  the time limit is rlspeed's ``task.max_steps`` (a truncation, which bootstraps);
- observations and rewards are float32, the state is Playground's ``State`` (a pytree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

if TYPE_CHECKING:
    import mujoco
    from mujoco_playground import MjxEnv, State

# The size of a video's frames (Playground's own default for its renders).
FRAME_HEIGHT, FRAME_WIDTH = 240, 320


def _strong(tree: State) -> State:
    """Every array of ``tree`` with a fixed dtype: Playground's ``reset`` and ``step`` give
    some leaves (a reward, a metric, the time) as weakly typed in one and not the other,
    and ``lax.scan`` takes a carry only when both have the same types."""

    def strong(leaf: jax.Array) -> jax.Array:
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return leaf
        return jax.lax.convert_element_type(leaf, leaf.dtype)

    typed: State = jax.tree.map(strong, tree)
    return typed


def action_space(env: MjxEnv) -> spaces.Box:
    """The actuators' control ranges (unbounded where an actuator has none): [-1, 1] for
    every actuator of the DM Control suite."""
    model = env.mj_model
    limited = model.actuator_ctrllimited.astype(bool)
    low = np.where(limited, model.actuator_ctrlrange[:, 0], -np.inf).astype(np.float32)
    high = np.where(limited, model.actuator_ctrlrange[:, 1], np.inf).astype(np.float32)
    return spaces.Box(low, high, dtype=np.float32)


def observation_space(env: MjxEnv) -> spaces.Space[Any]:
    """An unbounded float32 Box of the observation's shape, read without stepping; a
    dictionary of observations (pixels) as a Dict, which the task refuses."""
    shape = jax.eval_shape(env.reset, jax.random.key(0)).obs
    if isinstance(shape, dict):
        return spaces.Dict({k: spaces.Box(-np.inf, np.inf, v.shape) for k, v in shape.items()})
    return spaces.Box(-np.inf, np.inf, shape.shape, np.float32)


class PlaygroundTwin:
    """An ``MjxEnv``'s ``reset``/``step`` as a ``FunctionalEnv``, and its state drawn by
    MuJoCo for videos (``frame``)."""

    # Its physics is deterministic; an env that draws at a step keeps its own key in its state.
    transition_uses_rng = False
    # Frames come from MuJoCo's OpenGL renderer (rlspeed.video names what it needs).
    draws_with_mujoco = True

    def __init__(self, env: MjxEnv) -> None:
        self.env = env
        self.observation_space: spaces.Space[Any] = observation_space(env)
        self.action_space: spaces.Space[Any] = action_space(env)
        # One frame per control step.
        self.render_fps = max(1, round(1 / env.dt))
        self._renderer: mujoco.Renderer | None = None  # made at the first frame

    def frame(self, state: State) -> np.ndarray:
        """An RGB image [height, width, 3] of ``state`` (one env's, on the host) from the
        model's free camera, as Playground draws its envs."""
        import mujoco

        model = self.env.mj_model
        if self._renderer is None:
            self._renderer = mujoco.Renderer(model, height=FRAME_HEIGHT, width=FRAME_WIDTH)
        data = mujoco.MjData(model)
        # Positions and velocities set the scene (mj_forward computes the rest from them).
        data.qpos, data.qvel = np.asarray(state.data.qpos), np.asarray(state.data.qvel)
        data.mocap_pos = np.asarray(state.data.mocap_pos)
        data.mocap_quat = np.asarray(state.data.mocap_quat)
        mujoco.mj_forward(model, data)
        self._renderer.update_scene(data)
        image: np.ndarray = self._renderer.render()
        return image

    def initial(self, rng: jax.Array, params: None = None) -> State:
        return _strong(self.env.reset(rng))

    def transition(
        self,
        state: State,
        action: jax.Array,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> State:
        return _strong(self.env.step(state, jnp.asarray(action, jnp.float32)))

    def observation(
        self, state: State, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        return jnp.asarray(state.obs, jnp.float32)

    def reward(
        self,
        state: State,
        action: jax.Array,
        next_state: State,
        rng: jax.Array | None = None,
        params: None = None,
    ) -> jax.Array:
        return jnp.asarray(next_state.reward, jnp.float32).reshape(())

    def terminal(
        self, state: State, rng: jax.Array | None = None, params: None = None
    ) -> jax.Array:
        # Playground's done is a float (0 or 1).
        ended: jax.Array = jnp.asarray(state.done).reshape(()) > 0
        return ended
