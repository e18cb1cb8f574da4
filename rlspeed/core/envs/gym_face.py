"""A Gymnasium face of any functional JAX env (``rlspeed.core.envs.vmap.FunctionalEnv``), for
the Gymnasium engines: one env, stepped by one compiled call per step, NumPy out.

Nothing of a particular library is in it, so any twin that runs fused on ``env=jax-vmap``
also runs on ``gym-sync`` and ``gym-async`` with the same semantics: the twin's own ends are
terminations, the task's ``TimeLimit`` wrapper truncates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import jax
import numpy as np
from jax.typing import ArrayLike

from rlspeed.core.state import tree_from_host, tree_to_host
from rlspeed.seeding import Stream, jax_key

if TYPE_CHECKING:
    from rlspeed.core import PyTree
    from rlspeed.core.envs.vmap import FunctionalEnv


class Stepped(NamedTuple):
    """What one compiled step gives back: the env's next state and what Gymnasium returns."""

    state: PyTree
    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array


class Compiled(NamedTuple):
    start: Callable[[jax.Array], tuple[PyTree, jax.Array]]
    step: Callable[[PyTree, ArrayLike, jax.Array], Stepped]


# Each twin's compiled functions, by the twin's identity (the twin held with them, so that
# its id is not reused): every face of one twin shares them, so n envs compile once (a task
# makes one twin per settings).
_COMPILED: dict[int, tuple[FunctionalEnv, Compiled]] = {}


def compiled(twin: FunctionalEnv) -> Compiled:
    """The twin's start and step, each jitted once per twin."""
    if id(twin) not in _COMPILED:
        _COMPILED[id(twin)] = (twin, _compile(twin))
    return _COMPILED[id(twin)][1]


def _compile(twin: FunctionalEnv) -> Compiled:
    uses_rng = getattr(twin, "transition_uses_rng", True)

    def start(key: jax.Array) -> tuple[PyTree, jax.Array]:
        state = twin.initial(key)
        return state, twin.observation(state)

    def step(state: PyTree, action: jax.Array, key: jax.Array) -> Stepped:
        following = twin.transition(state, action, key if uses_rng else None)
        reward = twin.reward(state, action, following)
        return Stepped(following, twin.observation(following), reward, twin.terminal(following))

    return Compiled(jax.jit(start), jax.jit(step))


class FunctionalGymEnv(gym.Env[np.ndarray, np.ndarray]):
    """One env of ``twin`` as a Gymnasium env; the task wraps it in ``TimeLimit``. Its key and
    the twin's state are its state: it hands them over for resume files
    (``rlspeed_get_state``)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - Gymnasium's own field

    def __init__(self, twin: FunctionalEnv) -> None:
        self.observation_space = twin.observation_space
        self.action_space = twin.action_space
        self._compiled = compiled(twin)
        self._key = jax.random.key(0)
        self._state: PyTree | None = None
        # A twin that draws its state (``frame(state)``, at ``render_fps``) is filmed in
        # rgb_array (rlspeed's videos); ``draws_with_mujoco``: MuJoCo draws it (OpenGL).
        self._frame: Callable[[PyTree], np.ndarray] | None = getattr(twin, "frame", None)
        if self._frame is not None:
            fps = getattr(twin, "render_fps", 30)
            self.metadata = {"render_modes": ["rgb_array"], "render_fps": fps}
        self.draws_with_mujoco = getattr(twin, "draws_with_mujoco", False)
        self.render_mode: str | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:  # Gymnasium's 64-bit reset seeds: hashed into a key
            self._key = jax_key(seed, Stream.ENV)
        self._key, key = jax.random.split(self._key)
        self._state, obs = self._compiled.start(key)
        return np.asarray(obs), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        assert self._state is not None, "reset() before step()"
        self._key, key = jax.random.split(self._key)
        # One dtype whatever the caller hands over (float64 from NumPy, a Python int), so
        # that the step compiles once.
        action = np.asarray(action, self.action_space.dtype)
        stepped = self._compiled.step(self._state, action, key)
        self._state = stepped.state
        return np.asarray(stepped.obs), float(stepped.reward), bool(stepped.terminated), False, {}

    def render(self) -> np.ndarray | None:
        """The state as its twin draws it (``rgb_array``), once reset."""
        if self.render_mode != "rgb_array" or self._frame is None:
            return None
        assert self._state is not None, "reset() before render()"
        return self._frame(self._state)

    def rlspeed_get_state(self) -> dict[str, Any]:
        """The key and the twin's state as NumPy arrays (README, An env's own state)."""
        state = None if self._state is None else tree_to_host(self._state)
        return {"key": tree_to_host(self._key), "state": state}

    def rlspeed_set_state(self, saved: dict[str, Any]) -> None:
        self._key = tree_from_host(self._key, saved["key"])
        if saved["state"] is not None:
            template = self._state
            if template is None:
                template, _ = self._compiled.start(self._key)
            self._state = tree_from_host(template, saved["state"])
