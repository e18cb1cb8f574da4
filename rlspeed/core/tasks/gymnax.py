"""Any gymnax environment: ``task.id`` as ``gymnax.make`` knows it (its 26 built-in envs:
classic control, MinAtar, bsuite, misc), or an id a user's module registers with
``gymnax.register`` (``task.import`` is imported first), made with ``task.kwargs``.

It runs fused on ``env=jax-vmap`` (the env's ``reset_env``/``step_env`` inside the compiled
program, ``rlspeed.core.envs.gymnax.GymnaxTwin``) and on the Gymnasium engines through a
Gymnasium face of the same twin, so one env compares across every stack. As for
``task=gym``, what fits depends on the env's spaces (``rlspeed.core.tasks._spaces``), read
once per settings. Needs the extra: ``pip install "rlspeed[gymnax]"``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import TYPE_CHECKING, Any, cast

from rlspeed.config import MAX_EPISODE_STEPS
from rlspeed.core.tasks import Policy, TaskSpec, check_settings, mean_return_on_device
from rlspeed.core.tasks._spaces import EnvFacts, SpaceAnswers, check_observations
from rlspeed.core.tasks.gym import GymTaskConfig, import_user_modules, settings_kwargs
from rlspeed.errors import ConfigError, one_line

if TYPE_CHECKING:
    import gymnasium as gym
    from gymnax.environments.environment import Environment

    from rlspeed.core.envs.gymnax import GymnaxTwin

INSTALL = 'pip install "rlspeed[gymnax]"'


class GymnaxTaskConfig(GymTaskConfig):
    """``task=gym``'s settings, read for gymnax: ``id`` a gymnax id (``gymnax.registered_envs``
    lists them), ``kwargs`` for ``gymnax.make``, ``max_steps`` null for the env's own
    ``max_steps_in_episode``."""

    name: str = "gymnax"


dataclasses.dataclass(frozen=True, init=False)(GymnaxTaskConfig)


def _gymnax() -> Any:
    """The gymnax package, or one line saying how to install it."""
    try:
        import gymnax
    except ImportError as error:
        allowed = f"an installed gymnax ({one_line(error)}): {INSTALL}"
        raise ConfigError("task", "gymnax", allowed) from None
    return gymnax


def env_facts(cfg: GymnaxTaskConfig) -> EnvFacts:
    """The env's spaces (as Gymnasium's) and its own episode limit, read once per settings."""
    kwargs = json.dumps(settings_kwargs(cfg), sort_keys=True)
    return _read_env(getattr(cfg, "import"), str(cfg.id), kwargs)


@functools.cache
def _read_env(module: str | None, env_id: str, kwargs_json: str) -> EnvFacts:
    env, params = _make(module, env_id, json.loads(kwargs_json))
    from rlspeed.core.envs.gymnax import gymnasium_space  # gymnax is installed (_make)

    observations = gymnasium_space(env.observation_space(params), True)
    actions = gymnasium_space(env.action_space(params), False)
    check_observations(observations, "task.id", env_id)
    return EnvFacts(observations, actions, int(params.max_steps_in_episode))


def _make(module: str | None, env_id: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``gymnax.make(env_id, **kwargs)`` after the user's module; one line where it fails."""
    gymnax = _gymnax()
    import_user_modules(module, None)
    if env_id not in gymnax.registered_envs:
        known = ", ".join(gymnax.registered_envs)
        raise ConfigError("task.id", env_id, f"a registered gymnax id: {known}")
    try:
        return gymnax.make(env_id, **kwargs)  # type: ignore[no-any-return]
    except Exception as error:  # a keyword the env does not take, a user factory failing
        if kwargs:
            allowed = f"keyword arguments {env_id} takes ({one_line(error)})"
            raise ConfigError("task.kwargs", kwargs, allowed) from None
        allowed = f"an env gymnax can make ({one_line(error)})"
        raise ConfigError("task.id", env_id, allowed) from None


def own_limit(cfg: GymnaxTaskConfig) -> int:
    """The env's own episode limit: its default ``max_steps_in_episode``."""
    limit = env_facts(cfg).max_episode_steps
    assert limit is not None  # _read_env sets it from the env's params
    return limit


def settle(cfg: GymnaxTaskConfig) -> GymnaxTaskConfig:
    """``max_steps: null`` as the env's own ``max_steps_in_episode``."""
    return cfg if cfg.max_steps is not None else dataclasses.replace(cfg, max_steps=own_limit(cfg))


def validate(cfg: GymnaxTaskConfig) -> None:
    """An env gymnax can make, with a time limit in [1, MAX_EPISODE_STEPS] (a score waits
    for every one of its episodes to end)."""
    own = own_limit(cfg)
    if cfg.max_steps is None or not 1 <= cfg.max_steps <= MAX_EPISODE_STEPS:
        allowed = f"an integer in [1, {MAX_EPISODE_STEPS:,}] ({cfg.id}'s own limit: {own:,})"
        raise ConfigError("task.max_steps", cfg.max_steps, allowed)
    check_settings(cfg)


def make_functional(cfg: GymnaxTaskConfig) -> GymnaxTwin:
    """The env's twin, its own limit (``max_steps_in_episode``) set to ``task.max_steps``:
    one per settings in a process, so the envs of a run share its compiled functions."""
    kwargs = json.dumps(settings_kwargs(cfg), sort_keys=True)
    return _twin(getattr(cfg, "import"), str(cfg.id), kwargs, cast(int, cfg.max_steps))


@functools.cache
def _twin(module: str | None, env_id: str, kwargs_json: str, max_steps: int) -> GymnaxTwin:
    from rlspeed.core.envs.gymnax import GymnaxTwin

    env, params = _make(module, env_id, json.loads(kwargs_json))
    return GymnaxTwin(env, params.replace(max_steps_in_episode=max_steps))


def make_env(cfg: GymnaxTaskConfig) -> gym.Env:
    """The twin's Gymnasium face, with ``task.max_steps`` as its time limit."""
    from gymnasium.wrappers import TimeLimit

    from rlspeed.core.envs.gymnax import GymnaxGymEnv

    # Settled and checked: an int.
    return TimeLimit(GymnaxGymEnv(make_functional(cfg)), cast(int, cfg.max_steps))


def _standard(cfg: GymnaxTaskConfig) -> GymnaxTaskConfig:
    """The settings a score is measured at: the env's own episode limit."""
    return dataclasses.replace(cfg, max_steps=own_limit(cfg))


def evaluate(cfg: GymnaxTaskConfig, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` episodes at the env's
    own episode limit."""
    from rlspeed.core.tasks._episodes import mean_greedy_return

    standard = _standard(cfg)
    return mean_greedy_return(lambda: make_env(standard), policy, cfg.eval_episodes, seed)


# Which algorithms fit, and the sizes the checks and networks need: from the env's spaces.
ANSWERS = SpaceAnswers("gymnax", env_facts)

SPEC = TaskSpec(
    name="gymnax",
    schema=GymnaxTaskConfig,
    # Per env: check_algo judges each algorithm against the env's spaces.
    action_kind="the env's",
    make_env=make_env,
    make_functional=make_functional,
    evaluate=evaluate,
    evaluate_on_device=mean_return_on_device(make_functional, _standard),
    observation_bytes=ANSWERS.observation_bytes,
    network_inputs=ANSWERS.network_inputs,
    image_shape=ANSWERS.image_shape,
    tabular=ANSWERS.tabular(),
    settle=settle,
    validate=validate,
    check_algo=ANSWERS.check_algo,
    # The env's own limit is task.max_steps (make_functional): no other truncation.
    truncates_only_at_time_limit=True,
    env_runs_jax=True,
)


# The env objects of gymnax_task, by name: the factory it registers with gymnax reads them.
_OBJECTS: dict[str, Environment[Any, Any]] = {}


def gymnax_task(name: str, env: Environment[Any, Any]) -> TaskSpec:
    """A task of a user's own env in gymnax's interface (an ``Environment`` object, with its
    ``default_params``), without a module of its own: ``rlspeed.train(task=gymnax_task(
    "corridor", Corridor()), ...)``. It is ``task=gymnax`` with the env registered in gymnax
    under ``name`` (``task.id``, ``task.name``), for this process: ``env=gym-async``'s
    workers are other processes, which need a module registering it (``task.import``)."""
    gymnax = _gymnax()
    if name in gymnax.registered_envs and name not in _OBJECTS:
        allowed = "a name that is not a gymnax id already (gymnax.registered_envs)"
        raise ConfigError("task", name, allowed)
    if name not in _OBJECTS:
        gymnax.register(name, lambda **kwargs: _OBJECTS[name])
    # A name given again (a notebook's cell run anew) takes the new object: what was read
    # and built of the old one goes.
    _OBJECTS[name] = env
    _read_env.cache_clear()
    _twin.cache_clear()
    schema = type(
        f"{type(env).__name__}TaskConfig",
        (GymnaxTaskConfig,),
        {"__annotations__": {"name": "str", "id": "str"}, "name": name, "id": name},
    )
    dataclasses.dataclass(frozen=True, init=False)(schema)
    return dataclasses.replace(SPEC, name=name, schema=schema)
