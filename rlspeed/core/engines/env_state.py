"""A Gymnasium env's state as plain values, taken and put back through the vector env's
``call`` and ``set_attr`` (which run in the worker processes on gym-async): no env is pickled.

An env at a step is what its layers (each wrapper, then the env itself) hold, attribute by
attribute: each value a resume file holds exactly (None, bools, ints, floats, strings, NumPy
arrays and scalars without Python objects in them, and lists, tuples and dicts of these:
TimeLimit's step count, CartPole's ``state``, MountainCar's tuple, Doors' position, goal and
walls), the state of each NumPy generator (``np_random``) and of each MuJoCo simulation
(``mj_getState``: positions, velocities, time, solver warm start, all that ``mj_step``
reads). Constants come along: putting back the value they have changes nothing. What the env
was built with is left out: spaces, specs, functions, MuJoCo models and renderers, the
constructor arguments Gymnasium records, and the env checker's copy of the first
observations (read only by its own checks of the first steps).

Anything else (a deque, a ``random.Random``, an object of the env's own) cannot be saved
exactly, so a run of such an env cannot resume: ``check_resumable`` refuses
``checkpoint_every`` and ``resume=`` for it, unless the layer that holds it hands its state
over itself through the hook ``rlspeed_get_state() -> plain values`` and
``rlspeed_set_state(state)`` (README, "An env's own state"): rlspeed then saves what the hook
returns beside what it saves of that layer itself, and puts the hook's back last.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
import types
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.wrappers import PassiveEnvChecker

from rlspeed.errors import ConfigError
from rlspeed.registry import ENGINES, TASKS
from rlspeed.secrets import mask

if TYPE_CHECKING:
    from rlspeed.config import RunConfig, TaskConfig

# The hook a user's env (or wrapper) may define to hand over state rlspeed cannot take.
HOOK_GET, HOOK_SET = "rlspeed_get_state", "rlspeed_set_state"
# What ``with_state_access`` adds to the env, which the vector env reaches by name
# (Env.get_wrapper_attr); named apart from the hook, which a layer below may define.
GET_STATE, SET_STATE = "_rlspeed_take_state", "_rlspeed_put_back_state"
SAVED_STATE = "_rlspeed_saved_state"
# Attributes Gymnasium sets as it builds an env (Wrapper, EzPickle: the constructor's
# arguments, which may be any object and are never read again by a step).
_CONSTRUCTOR_RECORDS = frozenset({"_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs"})
# Types of attributes set as the env is built and never changed by a step.
_BUILT_WITH: tuple[type, ...] = (
    gym.Space,
    EnvSpec,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    functools.partial,
)
_PLAIN = (bool, int, float, str, type(None))
_CONTAINERS = (list, tuple, dict)


def with_state_access(env: gym.Env) -> gym.Env:
    """``env`` with the two functions the vector env calls to take and put back its state:
    attributes of the env rather than a wrapper, so a step costs what it did."""
    setattr(env, GET_STATE, functools.partial(env_state, env))
    setattr(env, SET_STATE, functools.partial(restore_saved, env))
    return env


def env_state(env: gym.Env) -> list[dict[str, Any]]:
    """Per layer, outermost first: its plain values, generators' and simulations' states,
    and what its hook returns (under ``hook``, where it has one)."""
    layers = _layers(env)
    return [_layer_state(layer, layers) for layer in layers]


def restore_saved(env: gym.Env) -> None:
    """Put back the ``env_state`` that ``set_attr`` left in the env's ``SAVED_STATE``."""
    state = getattr(env, SAVED_STATE)
    delattr(env, SAVED_STATE)
    layers, mujoco = _layers(env), sys.modules.get("mujoco")  # loaded where an env simulates
    if len(state) != len(layers):
        raise ValueError(f"the saved env has {len(state)} layers, this one {len(layers)}")
    for layer, saved in zip(layers, state, strict=True):
        for name, value in saved["values"].items():
            setattr(layer, name, value)
        for name, value in saved["generators"].items():
            getattr(layer, name).bit_generator.state = value
        for name, value in saved["simulations"].items():
            data = getattr(layer, name)
            assert mujoco is not None  # the saved simulation ran in this kind of env
            mujoco.mj_setState(data.model, data, value, mujoco.mjtState.mjSTATE_INTEGRATION)
        if "hook" in saved:  # last: the layer's own word on its state wins
            getattr(layer, HOOK_SET)(saved["hook"])


def check_resumable(cfg: RunConfig) -> str | None:
    """Why a run of ``cfg`` cannot resume exactly, as the line its log gives; None where it
    can. On the Gymnasium engines, a training run whose env keeps state that ``env_state``
    cannot save (and its hook does not hand over) cannot: ``checkpoint_every`` other than
    0 and ``resume=`` are refused in one line, and ``auto`` is off for it (a run that cannot
    resume gains nothing from writing its state while it trains). The env is built, reset
    and stepped once to see what it keeps."""
    if cfg.mode != "train" or ENGINES.get(cfg.env.name).needs_functional_env:
        return None
    unsaved = _unsaved_state(cfg.task)
    if unsaved is None:
        return None
    env = f"env {getattr(cfg.task, 'id', None) or cfg.task.name}"
    why = (
        f"it keeps state in {unsaved} that rlspeed cannot save (an env can hand over such "
        f"state with {HOOK_GET} and {HOOK_SET} methods: README, An env's own state)"
    )
    if cfg.resume is not None:
        raise ConfigError("resume", cfg.resume, f"no resume of {env}: {why}")
    if cfg.checkpoint_every not in (0, "auto"):
        allowed = f"0 or auto (both off) for {env}, whose runs cannot resume: {why}"
        raise ConfigError("checkpoint_every", cfg.checkpoint_every, allowed)
    off = " (checkpoint_every=auto is off for it)" if cfg.checkpoint_every == "auto" else ""
    return f"rlspeed: this run cannot be resumed{off}: {env} {why.removeprefix('it ')}"


def _unsaved_state(task_cfg: TaskConfig) -> str | None:
    """Where the task's env keeps state that ``env_state`` cannot save, as ``unsaved_state``
    says."""
    env = TASKS.get(task_cfg.name).make_env(task_cfg)
    # The env checker's warnings are the run's envs' to give. An env that fails here
    # fails in the run too, which reports it: judged as far as it got.
    with warnings.catch_warnings(), contextlib.suppress(Exception):
        warnings.simplefilter("ignore")
        env.reset(seed=0)
        env.action_space.seed(0)
        env.step(env.action_space.sample())
    verdict = unsaved_state(env)
    with contextlib.suppress(Exception):  # the task's check and the run's end report it
        env.close()
    return verdict


def unsaved_state(env: gym.Env) -> str | None:
    """The first attribute of ``env`` (any layer) holding state that ``env_state`` cannot
    save, as ``name (what it is)``; for a layer with the hook, what the hook returns where
    it is not plain values. None where the whole state is saved."""
    layers = _layers(env)
    for layer in layers:
        if _has_hook(layer):
            if (what := _not_plain(getattr(layer, HOOK_GET)())) is not None:
                return f"{type(layer).__name__}.{HOOK_GET}() ({what})"
            continue
        for name, value in _state_attributes(layer, layers):
            if not _taken_apart(value) and (what := _not_plain(value)) is not None:
                return f"{name} ({what})"
    return None


def _layers(env: gym.Env) -> list[gym.Env]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _has_hook(layer: gym.Env) -> bool:
    # Looked up on the class: a wrapper's own, never one it reaches through to its env.
    return callable(getattr(type(layer), HOOK_GET, None))


def _state_attributes(layer: gym.Env, layers: list[gym.Env]) -> Iterator[tuple[str, Any]]:
    """The layer's attributes that may change as it steps (what it was built with aside)."""
    renderer = sys.modules.get("gymnasium.envs.mujoco.mujoco_rendering")
    mujoco = sys.modules.get("mujoco")
    for name, value in vars(layer).items():
        built_with = (
            name in _CONSTRUCTOR_RECORDS
            or isinstance(value, _BUILT_WITH)
            or any(value is other for other in layers)  # a wrapper's env: a layer of its own
            or (isinstance(layer, PassiveEnvChecker) and name == "_previous_data")
            or (renderer is not None and isinstance(value, renderer.MujocoRenderer))
            or (mujoco is not None and isinstance(value, mujoco.MjModel))
            # A URL with a password: from task.kwargs, which the resumed run is given again;
            # a resume file never holds a password (rlspeed.secrets).
            or (isinstance(value, str) and mask(value) != value)
        )
        if not built_with:
            yield name, value


def _taken_apart(value: object) -> bool:
    """A NumPy generator or a MuJoCo simulation: saved by its own state, not as a value."""
    mujoco = sys.modules.get("mujoco")
    return isinstance(value, np.random.Generator) or (
        mujoco is not None and isinstance(value, mujoco.MjData)
    )


def _not_plain(value: Any) -> str | None:
    """None where a resume file (``rlspeed.statefile``) holds ``value`` exactly, as the
    type it has; else what it is (``a deque``, ``a list holding a Foo``). Exact types: a
    subclass (a defaultdict, a named tuple, an IntEnum) would read back as its base."""
    if type(value) in _PLAIN:
        return None
    if isinstance(value, np.ndarray | np.generic):
        return f"a NumPy {value.dtype} array" if value.dtype.hasobject else None
    if type(value) not in _CONTAINERS:
        return f"a {type(value).__name__}"
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    for item in items:
        if (what := _not_plain(item)) is not None:
            return f"a {type(value).__name__} holding {what}"
    return None


def _layer_state(layer: gym.Env, layers: list[gym.Env]) -> dict[str, Any]:
    mujoco = sys.modules.get("mujoco")
    state: dict[str, Any] = {"values": {}, "generators": {}, "simulations": {}}
    for name, value in _state_attributes(layer, layers):
        if isinstance(value, np.random.Generator):
            state["generators"][name] = value.bit_generator.state
        elif mujoco is not None and isinstance(value, mujoco.MjData):
            kind = mujoco.mjtState.mjSTATE_INTEGRATION
            saved = np.empty(mujoco.mj_stateSize(value.model, kind))
            mujoco.mj_getState(value.model, value, saved, kind)
            state["simulations"][name] = saved
        elif _not_plain(value) is None:
            # A copy: the env goes on changing its lists and arrays in place.
            state["values"][name] = copy.deepcopy(value)
    if _has_hook(layer):
        state["hook"] = copy.deepcopy(getattr(layer, HOOK_GET)())
    return state
