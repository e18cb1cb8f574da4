"""A Gymnasium env's state as plain values, taken and put back through the vector env's
``call`` and ``set_attr`` (which run in the worker processes on gym-async): no env is pickled.

An env at a step is what its layers (each wrapper, then the env itself) hold as plain values:
each attribute that is None, a bool, a number or a numeric NumPy array (TimeLimit's step
count, CartPole's ``state`` and ``steps_beyond_terminated``, Pendulum's ``state``, Doors'
position, goal and distance), the state of each NumPy generator (``np_random``) and of each
MuJoCo simulation (``mj_getState``: positions, velocities, time, solver warm start, all that
``mj_step`` reads). Constants (sizes, physical parameters) come along: putting back the
value they have changes nothing. Everything else (spaces, specs, renderers, the env checker's
last observation) is what the env was built with.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

# The env's attributes the vector env reaches by name (Env.get_wrapper_attr).
GET_STATE, SET_STATE, SAVED_STATE = "rlspeed_get_state", "rlspeed_set_state", "rlspeed_saved"
_NUMERIC = "biufc"  # bool, int, unsigned, float, complex dtypes


def with_state_access(env: gym.Env) -> gym.Env:
    """``env`` with the two functions the vector env calls to take and put back its state:
    attributes of the env rather than a wrapper, so a step costs what it did."""
    setattr(env, GET_STATE, partial(env_state, env))
    setattr(env, SET_STATE, partial(restore_saved, env))
    return env


def env_state(env: gym.Env) -> list[dict[str, dict[str, Any]]]:
    """Per layer, outermost first: its plain values, generators' and simulations' states."""
    return [_layer_state(layer) for layer in _layers(env)]


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


def _layers(env: gym.Env) -> list[gym.Env]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _layer_state(layer: gym.Env) -> dict[str, dict[str, Any]]:
    mujoco = sys.modules.get("mujoco")
    state: dict[str, dict[str, Any]] = {"values": {}, "generators": {}, "simulations": {}}
    for name, value in vars(layer).items():
        if isinstance(value, np.random.Generator):
            state["generators"][name] = value.bit_generator.state
        elif mujoco is not None and isinstance(value, mujoco.MjData):
            kind = mujoco.mjtState.mjSTATE_INTEGRATION
            saved = np.empty(mujoco.mj_stateSize(value.model, kind))
            mujoco.mj_getState(value.model, value, saved, kind)
            state["simulations"][name] = saved
        elif isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in _NUMERIC:
            state["values"][name] = value.copy()
        elif value is None or isinstance(value, (bool, int, float)):
            state["values"][name] = value
    return state
