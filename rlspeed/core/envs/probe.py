"""Probe environments: MDPs of one or two states whose values and optimal actions are known
in closed form, so a test can check what an agent learned against the exact answer instead
of against another backend (a mistake every backend shares passes that comparison).

Two implementations with identical dynamics: :class:`ProbeEnv` here, a plain
:class:`gymnasium.Env`, and its pure-JAX twin :class:`rlspeed.core.envs.probe_jax.ProbeFunctional`,
kept apart so that the plain env never loads JAX. Both compute rewards and moves with the
functions below, written once for NumPy and ``jax.numpy`` (``xp``).

The state is ``s`` in {0, 1} while an episode runs and ``s + 2`` once it has terminated in
``s`` (its final observation is that of ``s``: an agent that wrongly bootstraps through a
termination then reads a value it has learned). Each ``kind``, with its closed form for a
discount ``gamma`` (``V`` of a state under any policy, ``Q`` of a state and action):

- ``constant``: one step from state 0, reward 1, terminated. ``V(0) = Q(0, a) = 1``.
- ``observation``: one step from state 0 or 1 drawn uniformly, reward ``+1`` in state 1,
  ``-1`` in state 0, terminated. ``V(s) = Q(s, a) = 2s - 1``, the observation itself.
- ``discount``: two steps, 0 then 1, reward 0 then 1, terminated after the second.
  ``V(1) = 1`` and ``V(0) = gamma``.
- ``action``: one step from state 0 or 1 drawn uniformly, terminated. Discrete actions
  (two): reward 1 for action ``s``, else 0, so ``Q(s, s) = 1`` and ``Q(s, 1 - s) = 0``.
  Continuous actions (one, in [-1, 1]): reward ``1 - (a - t_s)^2`` with target
  ``t_s = s - 1/2`` (half the observation): the optimal action is ``t_s``, ``Q(s, a) = 1 -
  (a - t_s)^2``.
- ``truncation``: state 0 forever, reward 1 every step, never terminated: only the time
  limit (``max_steps``) ends an episode, by truncation. The observation does not tell the
  time, so the value that truncation-correct targets (bootstrapping from the final
  observation where an episode was truncated, not where it terminated) converge to is the
  infinite-horizon ``V(0) = Q(0, a) = 1 / (1 - gamma)``, for every ``max_steps``.
  Targets that treat truncation as termination converge instead to ``1 / (1 - gamma (1 -
  1 / max_steps))`` (a fraction ``1 / max_steps`` of the transitions are cut), ones that
  bootstrap through the ``constant`` probe's termination to ``1 / (1 - gamma)`` there.
- ``alternation``: states 0, 1, 0, 1, ... from state 0, reward ``+1`` in state 0 and ``-1``
  in state 1, never terminated. Truncation-correct targets converge to ``V(0) = 1 / (1 +
  gamma)`` and ``V(1) = -1 / (1 + gamma)`` for every ``max_steps`` >= 2. With an odd
  ``max_steps`` an episode is cut in state 1 while the next one starts in state 0, so
  targets that bootstrap from the wrong observation where an episode was truncated (the
  next episode's first, or another env's or transition's final one) converge elsewhere:
  from the next first one, at ``max_steps`` 3, to ``V(0) = (1 - gamma / 2) / (1 - gamma / 2
  - gamma^2 / 2)`` (1.2, not 2/3, at gamma 0.5).

Observations: ``continuous``, a float32 Box of shape (1,) holding ``2s - 1`` for the
``observation`` and ``action`` kinds and ``s`` for the others; ``categorical``, ``s`` itself
(``Discrete(2)``, int32), a tabular state. Actions: ``discrete``, ``Discrete(2)``;
``continuous``, a float32 Box [-1, 1] of shape (1,). Only the ``action`` kind's reward
depends on the action.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np
from gymnasium import spaces

if TYPE_CHECKING:
    from types import ModuleType

    from rlspeed.core import XpArray

    # A probe's state: a Python int in ``ProbeEnv``, an int32 JAX array in its twin.
    State = int | XpArray
    # An action: a Discrete one (a Python or NumPy integer), a Box one (a NumPy array of
    # shape (1,)), or either as a JAX array.
    Action = int | np.integer | XpArray

KINDS = ("constant", "observation", "discount", "action", "truncation", "alternation")
ACTION_KINDS = ("discrete", "continuous")
OBSERVATION_KINDS = ("continuous", "categorical")
# Kinds whose episodes start in state 0 or 1 at random (the others always in state 0).
RANDOM_START = ("observation", "action")
# Added to a state once its episode has terminated there.
TERMINATED = 2


def probe_spaces(actions: str, observations: str) -> tuple[spaces.Space[Any], spaces.Space[Any]]:
    """(observation space, action space) of a probe."""
    if actions not in ACTION_KINDS:
        raise ValueError(f"actions must be one of {ACTION_KINDS}, got {actions!r}")
    if observations not in OBSERVATION_KINDS:
        raise ValueError(f"observations must be one of {OBSERVATION_KINDS}, got {observations!r}")
    observation_space: spaces.Space[Any]
    if observations == "continuous":
        observation_space = spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    else:  # int32: what JAX produces with x64 disabled, so both engines' buffers agree
        observation_space = spaces.Discrete(2, dtype=np.int32)
    action_space: spaces.Space[Any]
    if actions == "continuous":
        action_space = spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    else:
        action_space = spaces.Discrete(2)
    return observation_space, action_space


def signed(kind: str) -> bool:
    """Whether the continuous observation of state ``s`` is ``2s - 1`` (else ``s``)."""
    return kind in RANDOM_START


def observe(kind: str, observations: str, state: State, xp: ModuleType) -> Any:
    """The observation of a state (running or terminated): see the module docstring."""
    s = state % TERMINATED
    if observations == "categorical":
        return xp.asarray(s, dtype=xp.int32)
    value = 2 * s - 1 if signed(kind) else s
    return xp.asarray(value, dtype=xp.float32).reshape(1)


def move(kind: str, state: State, xp: ModuleType) -> Any:
    """The state after a step from running state ``state``."""
    if kind == "truncation":
        return state
    if kind == "alternation":
        return 1 - state
    if kind == "discount":
        return xp.where(state == 0, 1, 1 + TERMINATED)
    return state + TERMINATED


def target_action(state: State) -> Any:
    """The ``action`` probe's optimal continuous action in state ``s``: ``s - 1/2``."""
    return state - 0.5


def reward(kind: str, actions: str, state: State, action: Action, xp: ModuleType) -> Any:
    """The reward of ``action`` in running state ``state`` (float32)."""
    if kind in ("constant", "truncation"):
        value = xp.ones_like(state)
    elif kind == "observation":
        value = 2 * state - 1
    elif kind == "alternation":
        value = 1 - 2 * state
    elif kind == "discount":
        value = state == 1
    elif actions == "discrete":
        value = xp.asarray(action).reshape(()) == state
    else:
        value = 1.0 - (xp.asarray(action, dtype=xp.float32).reshape(()) - target_action(state)) ** 2
    return xp.asarray(value, dtype=xp.float32)


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


class ProbeEnv(gymnasium.Env[Any, Any]):
    """Python implementation of the probes (the registered ``rlspeed/Probe-v0`` adds the
    time limit).

    ``kind``, ``actions`` and ``observations`` are as in the module docstring."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        kind: str = "constant",
        actions: str = "discrete",
        observations: str = "continuous",
        render_mode: str | None = None,
    ) -> None:
        check_kind(kind)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"unsupported render_mode {render_mode!r}")
        self.kind, self.actions, self.observations = kind, actions, observations
        self.render_mode = render_mode
        self.observation_space, self.action_space = probe_spaces(actions, observations)
        self._state = 0

    def _obs(self) -> Any:
        obs = observe(self.kind, self.observations, self._state, np)
        # A Python int for Discrete, as Gymnasium's env checker wants it.
        return int(obs) if self.observations == "categorical" else obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._state = int(self.np_random.integers(2)) if self.kind in RANDOM_START else 0
        return self._obs(), {}

    def step(
        self, action: int | np.integer | np.ndarray
    ) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self._state >= TERMINATED:
            raise RuntimeError("step() after the episode terminated: reset() first")
        value = float(reward(self.kind, self.actions, self._state, action, np))
        self._state = int(move(self.kind, self._state, np))
        return self._obs(), value, self._state >= TERMINATED, False, {}

    def render(self) -> str | None:
        """The state as text in ``ansi`` mode: ``s`` and whether the episode terminated."""
        if self.render_mode is None:
            gymnasium.logger.warn(
                'render() called without a render_mode; create the env with render_mode="ansi".'
            )
            return None
        ended = " (terminated)" if self._state >= TERMINATED else ""
        return f"state {self._state % TERMINATED}{ended}\n"
