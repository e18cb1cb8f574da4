"""MuJoCo Playground's DM Control suite: ``task.id`` one of
``mujoco_playground.dm_control_suite.ALL_ENVS`` (CartpoleBalance, PendulumSwingup,
CheetahRun, ...), loaded with ``task.kwargs`` as overrides of its config and stepped by MJX's
JAX implementation.

It runs fused on ``env=jax-vmap`` (the env's ``reset``/``step`` inside the compiled program,
``rlspeed.core.envs.playground.PlaygroundTwin``), through DLPack with torch, and on the
Gymnasium engines behind a Gymnasium face of the same twin. Playground's locomotion and
manipulation envs are refused: their models come from MuJoCo Menagerie, which Playground
clones from GitHub at first use. Needs the extra: ``pip install "rlspeed[playground]"``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rlspeed.config import MAX_EPISODE_STEPS, MISSING, TaskConfig, plain
from rlspeed.core.tasks import TaskSpec, check_settings, mean_return_on_device
from rlspeed.core.tasks._faced import face_env, face_score, standard_settings
from rlspeed.core.tasks._spaces import EnvFacts, SpaceAnswers, check_observations
from rlspeed.errors import ConfigError, one_line

if TYPE_CHECKING:
    from mujoco_playground import MjxEnv

    from rlspeed.core.envs.playground import PlaygroundTwin

INSTALL = 'pip install "rlspeed[playground]"'
# Config keys rlspeed decides: their values, and why.
OWN_KEYS: dict[str, tuple[object, str]] = {
    "impl": ("jax", "MJX's JAX implementation, which runs under vmap on any device"),
    "vision": (False, "the state observed, not images"),
}


@dataclass(frozen=True)
class PlaygroundTaskConfig(TaskConfig):
    name: str = "playground"
    # A DM Control suite env of MuJoCo Playground, e.g. CartpoleBalance.
    id: str = MISSING
    # Overrides of the env's config (ctrl_dt, sim_dt, episode_length, ...), each added with
    # +: +task.kwargs.ctrl_dt=0.02.
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Training episode length; null: the env's episode_length (1000), which the score is
    # always measured at.
    max_steps: int | None = None  # type: ignore[assignment]
    # Greedy episodes behind each score (mean episodic return).
    eval_episodes: int = 10


def _suites() -> tuple[ModuleType, ModuleType]:
    """Playground's DM Control suite and its registry, or one line saying how to install it."""
    try:
        from mujoco_playground import dm_control_suite, registry
    except ImportError as error:
        allowed = f"an installed MuJoCo Playground ({one_line(error)}): {INSTALL}"
        raise ConfigError("task", "playground", allowed) from None
    return dm_control_suite, registry


def _overrides(cfg: PlaygroundTaskConfig) -> dict[str, Any]:
    """``task.kwargs`` as Playground's config overrides, checked (``_load`` adds rlspeed's
    own keys)."""
    kwargs: dict[str, Any] = plain(cfg.kwargs)
    for key, (value, why) in OWN_KEYS.items():
        if key in kwargs and kwargs[key] != value:
            allowed = f"no {key}: rlspeed sets {key}={value} ({why})"
            raise ConfigError(f"task.kwargs.{key}", kwargs[key], allowed)
    if kwargs.get("action_repeat", 1) != 1:
        # Playground repeats actions in a training wrapper, which rlspeed does not use.
        allowed = "1 (rlspeed steps the env itself: a longer ctrl_dt acts less often)"
        raise ConfigError("task.kwargs.action_repeat", kwargs["action_repeat"], allowed)
    return kwargs


def env_facts(cfg: PlaygroundTaskConfig) -> EnvFacts:
    """The env's spaces and its own episode_length, read once per id and kwargs."""
    return _read_env(str(cfg.id), json.dumps(_overrides(cfg), sort_keys=True))


@functools.cache
def _read_env(env_id: str, overrides_json: str) -> EnvFacts:
    from rlspeed.core.envs.playground import action_space, observation_space

    overrides = json.loads(overrides_json)
    env = _load(env_id, overrides)
    observations = observation_space(env)
    check_observations(observations, "task.id", env_id)
    # The config's episode_length: Playground's training wrapper cuts episodes there.
    suite, _ = _suites()
    limit = overrides.get("episode_length", suite.get_default_config(env_id).episode_length)
    return EnvFacts(observations, action_space(env), int(limit))


def _load(env_id: str, overrides: dict[str, Any]) -> MjxEnv:
    """The env, loaded from the model files Playground ships; one line where it cannot be."""
    suite, registry = _suites()
    if env_id not in suite.ALL_ENVS:
        why = ""
        if env_id in registry.ALL_ENVS:  # locomotion, manipulation
            why = " (its model would be downloaded from MuJoCo Menagerie at first use)"
        allowed = f"a DM Control suite env of MuJoCo Playground{why}: {', '.join(suite.ALL_ENVS)}"
        raise ConfigError("task.id", env_id, allowed)
    from rlspeed.core.tasks._mujoco import log_mujoco_warnings

    log_mujoco_warnings()  # the cheetah's model warns of a deprecated attribute at each build
    config = suite.get_default_config(env_id)
    own = {key: value for key, (value, _) in OWN_KEYS.items() if key in config}
    try:
        env: MjxEnv = suite.load(env_id, config_overrides={**overrides, **own})
    except (KeyError, TypeError, ValueError) as error:
        if not overrides:
            raise ConfigError("task.id", env_id, f"an env that loads ({one_line(error)})") from None
        keys = ", ".join(key for key in config if not key.startswith(tuple(OWN_KEYS)))
        # A KeyError's message is the whole config; the keys say it in one line.
        why = "" if isinstance(error, KeyError) else f": {one_line(error)}"
        allowed = f"overrides of {env_id}'s config ({keys}){why}"
        raise ConfigError("task.kwargs", overrides, allowed) from None
    except Exception as error:  # a model file that cannot be read or compiled
        allowed = f"an env whose model loads offline ({one_line(error)})"
        raise ConfigError("task.id", env_id, allowed) from None
    return env


def own_limit(cfg: PlaygroundTaskConfig) -> int:
    """The env's own episode limit: its config's ``episode_length``."""
    limit = env_facts(cfg).max_episode_steps
    assert limit is not None  # _read_env reads it from the env's config
    return limit


def settle(cfg: PlaygroundTaskConfig) -> PlaygroundTaskConfig:
    """``max_steps: null`` as the env's own ``episode_length``."""
    return cfg if cfg.max_steps is not None else dataclasses.replace(cfg, max_steps=own_limit(cfg))


def validate(cfg: PlaygroundTaskConfig) -> None:
    """An env Playground loads offline, with a time limit in [1, MAX_EPISODE_STEPS] (a score
    waits for every one of its episodes to end)."""
    own = own_limit(cfg)
    if cfg.max_steps is None or not 1 <= cfg.max_steps <= MAX_EPISODE_STEPS:
        allowed = f"an integer in [1, {MAX_EPISODE_STEPS:,}] ({cfg.id}'s own limit: {own:,})"
        raise ConfigError("task.max_steps", cfg.max_steps, allowed)
    check_settings(cfg)


def make_functional(cfg: PlaygroundTaskConfig) -> PlaygroundTwin:
    """The env's twin: one per id and kwargs in a process, so the envs of a run (and their
    Gymnasium faces) share its compiled functions."""
    return _twin(str(cfg.id), json.dumps(_overrides(cfg), sort_keys=True))


@functools.cache
def _twin(env_id: str, overrides_json: str) -> PlaygroundTwin:
    from rlspeed.core.envs.playground import PlaygroundTwin

    return PlaygroundTwin(_load(env_id, json.loads(overrides_json)))


# The twin's Gymnasium face at task.max_steps, and its greedy score at the env's own limit.
make_env = partial(face_env, make_functional)
_standard = partial(standard_settings, own_limit)
evaluate = partial(face_score, make_env, own_limit)


# Which algorithms fit, and the sizes the checks and networks need: from the env's spaces
# (continuous actions and observations throughout the suite).
ANSWERS = SpaceAnswers("playground", env_facts)

SPEC = TaskSpec(
    name="playground",
    schema=PlaygroundTaskConfig,
    action_kind="continuous",
    make_env=make_env,
    make_functional=make_functional,
    evaluate=evaluate,
    evaluate_on_device=mean_return_on_device(make_functional, _standard),
    observation_bytes=ANSWERS.observation_bytes,
    network_inputs=ANSWERS.network_inputs,
    settle=settle,
    validate=validate,
    check_algo=ANSWERS.check_algo,
    # Only task.max_steps truncates: Playground's own limit is in a wrapper rlspeed leaves out.
    truncates_only_at_time_limit=True,
    env_runs_jax=True,
)
