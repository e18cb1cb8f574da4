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
import importlib.util
import json
import sys
import types
from collections.abc import Mapping
from dataclasses import field
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from rlspeed.config import MAX_EPISODE_STEPS
from rlspeed.core.tasks import TaskSpec, check_settings, mean_return_on_device
from rlspeed.core.tasks._faced import face_env, face_score, standard_settings
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
    ``max_steps_in_episode``, ``params`` the env params (``EnvParams``) set otherwise than
    the env's defaults."""

    name: str = "gymnax"
    # Env params by name, each added with +: +task.params.gravity=12.0. The float ones the
    # spaces do not depend on are inputs of the fused program (``traced``).
    params: dict[str, float] = field(default_factory=dict)


dataclasses.dataclass(frozen=True, init=False)(GymnaxTaskConfig)


class _OnFirstUse(types.ModuleType):
    """Stands in ``sys.modules`` for a module not imported yet: the first attribute asked of
    it imports the module, which then replaces it there. (``importlib.util.LazyLoader`` does
    not defer ``import name`` of a module already in ``sys.modules`` on Python 3.11: the
    import statement reads its ``__spec__``, which loads it.)"""

    def __getattr__(self, attribute: str) -> Any:
        if sys.modules.get(self.__name__) is self:  # not imported yet (by this or a copy)
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attribute)


def _defer(name: str) -> None:
    """Import module ``name`` on first use. Nothing where it is imported or not installed."""
    if name not in sys.modules and importlib.util.find_spec(name) is not None:
        sys.modules[name] = _OnFirstUse(name)


def _gymnax() -> Any:
    """The gymnax package, or one line saying how to install it. Its Pong and MinAtar frame
    renderers import seaborn, which imports scipy's statistics: 1.3 s or more of every
    process that imports gymnax, for frames rlspeed does not draw, so seaborn is imported
    on first use."""
    _defer("seaborn")
    try:
        import gymnax
    except ImportError as error:
        allowed = f"an installed gymnax ({one_line(error)}): {INSTALL}"
        raise ConfigError("task", "gymnax", allowed) from None
    return gymnax


def _made(cfg: GymnaxTaskConfig) -> tuple[str | None, str, str]:
    """What ``gymnax.make`` is called with: the module to import, the id, the keywords."""
    return getattr(cfg, "import"), str(cfg.id), json.dumps(settings_kwargs(cfg), sort_keys=True)


def env_facts(cfg: GymnaxTaskConfig) -> EnvFacts:
    """The env's spaces (as Gymnasium's) at its params and its own episode limit, read once
    per settings (the traced params leave the spaces as they are)."""
    return _read_env(*_made(cfg), json.dumps(_split_params(cfg)[0], sort_keys=True))


@functools.cache
def _read_env(module: str | None, env_id: str, kwargs_json: str, params_json: str) -> EnvFacts:
    env, params = _make(module, env_id, json.loads(kwargs_json))
    from rlspeed.core.envs.gymnax import env_spaces  # gymnax is installed (_make)

    observations, actions = env_spaces(env, params.replace(**json.loads(params_json)))
    check_observations(observations, "task.id", env_id)
    return EnvFacts(observations, actions, int(params.max_steps_in_episode))


@functools.cache
def _param_kinds(module: str | None, env_id: str, kwargs_json: str) -> dict[str, str]:
    """The env's params by name, each with its kind (``param_kinds``: traced or not)."""
    env, params = _make(module, env_id, json.loads(kwargs_json))
    from rlspeed.core.envs.gymnax import param_kinds

    return param_kinds(env, params)


def _split_params(cfg: GymnaxTaskConfig) -> tuple[dict[str, float | int], dict[str, Any]]:
    """``task.params`` as (the constants of the program, the traced params), an int where
    the env's param is one."""
    kinds = _param_kinds(*_made(cfg))
    static: dict[str, float | int] = {}
    traced: dict[str, Any] = {}
    for name, value in cfg.params.items():
        if name not in kinds or name == "max_steps_in_episode":
            continue  # refused by validate (_check_params), which runs after settle
        if kinds[name] == "traced":
            traced[name] = value
        else:
            static[name] = int(value) if kinds[name] == "int" else float(value)
    return static, traced


def _check_params(cfg: GymnaxTaskConfig) -> None:
    """``task.params``: the env's own params, but ``max_steps_in_episode`` (task.max_steps)."""
    kinds = _param_kinds(*_made(cfg))
    for name, value in cfg.params.items():
        if name not in kinds or name == "max_steps_in_episode":
            known = ", ".join(key for key in kinds if key != "max_steps_in_episode") or "none"
            allowed = f"one of {cfg.id}'s env params ({known}); its time limit is task.max_steps"
            raise ConfigError(f"task.params.{name}", value, allowed)


def traced(cfg: GymnaxTaskConfig) -> dict[str, float]:
    """The env params that are inputs of the fused program, as ``params.<name>``: a sweep's
    trials over them are lanes of one program."""
    return {f"params.{name}": value for name, value in _split_params(cfg)[1].items()}


def with_traced(cfg: GymnaxTaskConfig, values: Mapping[str, Any]) -> GymnaxTaskConfig:
    """``cfg`` with the traced params ``values`` (``traced``'s names; tracers, where the
    program is traced)."""
    params = {**cfg.params, **{name.removeprefix("params."): v for name, v in values.items()}}
    # The class is made a dataclass after its body (GymTaskConfig's import field), which mypy
    # does not follow.
    return dataclasses.replace(cfg, params=params)  # type: ignore[call-arg]


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
    _check_params(cfg)
    check_settings(cfg)


def make_functional(cfg: GymnaxTaskConfig) -> GymnaxTwin:
    """The env's twin at ``task.params``, its own limit (``max_steps_in_episode``) set to
    ``task.max_steps``: one per settings in a process, so the envs of a run share its
    compiled functions. Traced params that are tracers (the fused program's inputs) go into
    a twin of its own, sharing the spaces of the twin without them."""
    static, traced_params = _split_params(cfg)
    concrete = all(isinstance(value, int | float) for value in traced_params.values())
    fixed = {**static, **traced_params} if concrete else static
    twin = _twin(*_made(cfg), cast(int, cfg.max_steps), json.dumps(fixed, sort_keys=True))
    return twin if concrete else twin.with_params(traced_params)


@functools.cache
def _twin(
    module: str | None, env_id: str, kwargs_json: str, max_steps: int, params_json: str
) -> GymnaxTwin:
    from rlspeed.core.envs.gymnax import GymnaxTwin

    env, params = _make(module, env_id, json.loads(kwargs_json))
    values = json.loads(params_json)
    return GymnaxTwin(env, params.replace(max_steps_in_episode=max_steps, **values))


# The twin's Gymnasium face at task.max_steps, and its greedy score at the env's own limit.
make_env = partial(face_env, make_functional)
_standard = partial(standard_settings, own_limit)
evaluate = partial(face_score, make_env, own_limit)


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
    traced=traced,
    with_traced=with_traced,
)


# The env objects of gymnax_task, by name: the factory it registers with gymnax reads them.
_OBJECTS: dict[str, Environment[Any, Any]] = {}


def _register(name: str, env: Environment[Any, Any]) -> None:
    """``env`` as gymnax id ``name`` in this process. A name given again (a notebook's cell
    run anew) takes the new object: what was read and built of the old one goes."""
    gymnax = _gymnax()
    if name in gymnax.registered_envs and name not in _OBJECTS:
        allowed = "a name that is not a gymnax id already (gymnax.registered_envs)"
        raise ConfigError("task", name, allowed)
    if name not in _OBJECTS:
        gymnax.register(name, lambda **kwargs: _OBJECTS[name])
    if _OBJECTS.get(name) is not env:
        _OBJECTS[name] = env
        for cached in (_read_env, _param_kinds, _twin):
            cached.cache_clear()


def _make_object_env(name: str, env: Environment[Any, Any], cfg: GymnaxTaskConfig) -> gym.Env:
    """``make_env`` of a ``gymnax_task``: the object goes with it (pickled, to gym-async's
    workers, which are new processes with no registry of it) and is registered first."""
    _register(name, env)
    return make_env(cfg)


def gymnax_task(name: str, env: Environment[Any, Any]) -> TaskSpec:
    """A task of a user's own env in gymnax's interface (an ``Environment`` object, with its
    ``default_params``), without a module of its own: ``rlspeed.train(task=gymnax_task(
    "corridor", Corridor()), ...)``, or an option of a package's own through an entry point
    naming the spec (``[rlspeed.tasks] corridor = "my_envs:CORRIDOR"``). It is
    ``task=gymnax`` with the env registered in gymnax under ``name`` (``task.id``,
    ``task.name``); gym-async's workers get the object pickled, so its class must be
    importable (not defined in a notebook)."""
    _register(name, env)
    schema = type(
        f"{type(env).__name__}TaskConfig",
        (GymnaxTaskConfig,),
        {"__annotations__": {"name": "str", "id": "str"}, "name": name, "id": name},
    )
    dataclasses.dataclass(frozen=True, init=False)(schema)
    make_env = functools.partial(_make_object_env, name, env)
    return dataclasses.replace(SPEC, name=name, schema=schema, make_env=make_env)
