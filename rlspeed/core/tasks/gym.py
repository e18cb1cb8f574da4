"""Any registered Gymnasium env: ``task.id``, with ``task.kwargs`` for ``gym.make``, after
``task.import`` has imported a user's module (which may register its own envs).

Unlike the built-in tasks', what fits this task depends on its settings: the env's spaces.
They are read once per (import, id, kwargs) by making the env (``env_facts``), and every
answer the spec gives (which algorithms fit, observation bytes, network inputs, the tabular
state) comes from them (``rlspeed.core.tasks._spaces``). There is no JAX twin: it runs on the
Gymnasium engines.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlspeed.config import MAX_EPISODE_STEPS, MISSING, TaskConfig, plain
from rlspeed.core.tasks import Policy, TaskSpec, check_settings
from rlspeed.core.tasks._spaces import EnvFacts, SpaceAnswers, check_observations
from rlspeed.errors import ConfigError, one_line
from rlspeed.secrets import masked_accounts, reveal_value
from rlspeed.user_modules import import_user_module

# Gymnasium (and NumPy) load when an env is built or checked, not when the task is chosen.
if TYPE_CHECKING:
    import gymnasium as gym


# The render modes task.kwargs may make an env with: frames drawn only when asked for
# (mode=eval's video= picks its own), never a window (human: a display and pygame, and a
# frame drawn at every step).
RENDER_MODES = (None, "rgb_array", "ansi")


class GymTaskConfig(TaskConfig):
    name: str = "gym"
    # A registered Gymnasium id, e.g. Acrobot-v1 (``gymnasium.pprint_registry()`` lists them).
    id: str = MISSING
    # Keyword arguments for ``gym.make``; Hydra adds a key to a dict with +, e.g.
    # +task.kwargs.is_slippery=false.
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Training episode length; null: the id's registered max_episode_steps, the standard
    # length the score is always measured at (set in its place when the config is checked).
    max_steps: int | None = None  # type: ignore[assignment]
    # Greedy episodes behind each score (mean episodic return).
    eval_episodes: int = 10


def _init(self: GymTaskConfig, **values: object) -> None:
    """GymTaskConfig's ``__init__``: one taking every field by keyword, as a dataclass's
    does, which Python cannot generate with a parameter named ``import``."""
    for item in dataclasses.fields(self):
        if item.name in values:
            value = values.pop(item.name)
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            value = item.default
        object.__setattr__(self, item.name, value)  # frozen: set as dataclasses do
    if values:
        raise TypeError(f"{type(self).__name__} got unexpected keys: {', '.join(sorted(values))}")


# task.import: a module imported before the env is made. `import` is a Python keyword, so no
# class body can declare it: the field is added here, kept out of the generated __repr__
# and __eq__ (whose source would not parse), and the class's __init__ is written out
# (_init). Read it with getattr(cfg, "import").
GymTaskConfig.__annotations__["import"] = "str | None"
setattr(GymTaskConfig, "import", field(default=None, repr=False, compare=False))
GymTaskConfig.__init__ = _init  # type: ignore[assignment]
dataclass(frozen=True, init=False)(GymTaskConfig)


def settings_kwargs(cfg: GymTaskConfig) -> dict[str, Any]:
    """``task.kwargs`` as ``gym.make`` takes them: plain Python values, with the password of
    each URL in them put back (the config holds it masked, as everything stored does:
    ``rlspeed.secrets``), so that the user's env can connect."""
    revealed: dict[str, Any] = reveal_value(dict(plain(cfg.kwargs)))  # the schema's type
    for key, value in revealed.items():
        if accounts := masked_accounts(str(value)):  # a saved config's, or typed as ***
            raise ConfigError(
                f"task.kwargs.{key}",
                value,
                f"a URL with {accounts[0]}'s password, which rlspeed keeps only as *** (in "
                "config.yaml too): give it again on the command line or in "
                "RLSPEED_URL_PASSWORDS (README, Passwords)",
            )
    return revealed


def _check_keywords(kwargs: dict[str, Any]) -> None:
    """Keywords for ``gym.make`` that rlspeed sets itself or cannot run with."""
    if "max_episode_steps" in kwargs:  # gym.make would get it twice (a TypeError)
        raise ConfigError(
            "task.kwargs.max_episode_steps",
            kwargs["max_episode_steps"],
            "no such key: rlspeed makes the env with task.max_steps as its time limit (use "
            "task.max_steps=N)",
        )
    if kwargs.get("render_mode") not in RENDER_MODES:
        raise ConfigError(
            "task.kwargs.render_mode",
            kwargs["render_mode"],
            "null, rgb_array or ansi (rlspeed opens no window; mode=eval video=FILE films "
            "the env in a mode of its own)",
        )


def import_user_modules(module: str | None, env_id: str | None) -> None:
    """``task.import``, then the module of an id written ``module:Env-v0`` (which Gymnasium
    would import itself, with nothing to stop one that ends the process)."""
    if module:
        import_user_module("task.import", module)
    if env_id is not None and ":" in env_id:
        import_user_module("task.id", env_id.split(":")[0])


def env_facts(cfg: GymTaskConfig) -> EnvFacts:
    """The env's spaces and registered episode limit, read once per settings."""
    kwargs = settings_kwargs(cfg)
    _check_keywords(kwargs)
    return _read_env(getattr(cfg, "import"), str(cfg.id), json.dumps(kwargs, sort_keys=True))


@functools.cache
def _read_env(module: str | None, env_id: str, kwargs_json: str) -> EnvFacts:
    import gymnasium as gym

    import_user_modules(module, env_id)
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as error:
        allowed = f"a registered Gymnasium id ({one_line(error)})"
        raise ConfigError("task.id", env_id, allowed) from None
    kwargs = json.loads(kwargs_json)
    try:
        env = gym.make(env_id, **kwargs)
    except Exception as error:  # a keyword the env does not take, a missing dependency
        if kwargs:
            allowed = f"keyword arguments {env_id} takes ({one_line(error)})"
            raise ConfigError("task.kwargs", kwargs, allowed) from None
        allowed = f"an env Gymnasium can make ({one_line(error)})"
        raise ConfigError("task.id", env_id, allowed) from None
    facts = EnvFacts(env.observation_space, env.action_space, spec.max_episode_steps)
    try:
        env.close()
    except Exception as error:  # it would fail so at the end of every run
        allowed = f"an env that closes ({one_line(error)} in its close())"
        raise ConfigError("task.id", env_id, allowed) from None
    check_observations(facts.observation_space, "task.id", env_id)
    return facts


def settle(cfg: GymTaskConfig) -> GymTaskConfig:
    """``max_steps: null`` as the id's registered limit, where it registers one: a run
    records the number it trained with."""
    if cfg.max_steps is not None:
        return cfg
    registered = env_facts(cfg).max_episode_steps
    return cfg if registered is None else dataclasses.replace(cfg, max_steps=registered)


def validate(cfg: GymTaskConfig) -> None:
    """An env that can be made, with a time limit (``settle`` gives ``max_steps: null``
    the registered one). The length evaluation episodes play to (the registered limit, else
    ``max_steps``) is at most MAX_EPISODE_STEPS: a score waits for every one of its
    episodes to end."""
    registered = env_facts(cfg).max_episode_steps
    if registered is not None and not 1 <= registered <= MAX_EPISODE_STEPS:
        allowed = (
            f"an env whose registered max_episode_steps is in [1, {MAX_EPISODE_STEPS:,}] (it "
            f"registers {registered:,}, the length of its evaluation episodes)"
        )
        raise ConfigError("task.id", cfg.id, allowed)
    standard = f"an integer in [1, {MAX_EPISODE_STEPS:,}] ({cfg.id} registers no episode limit"
    if cfg.max_steps is None:
        raise ConfigError("task.max_steps", None, standard + ")")
    check_settings(cfg)
    if registered is None and cfg.max_steps > MAX_EPISODE_STEPS:
        allowed = standard + ": evaluation episodes last task.max_steps)"
        raise ConfigError("task.max_steps", cfg.max_steps, allowed)


def make_env(cfg: GymTaskConfig, max_steps: int | None = None) -> gym.Env:
    """The env with ``max_steps`` (the config's by default) as its time limit."""
    import gymnasium as gym

    # In every gym-async worker too: a spawned process has only the envs its imports register.
    import_user_modules(getattr(cfg, "import"), str(cfg.id))
    steps = cfg.max_steps if max_steps is None else max_steps
    return gym.make(cfg.id, max_episode_steps=steps, **settings_kwargs(cfg))


def evaluate(cfg: GymTaskConfig, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` episodes at the standard
    length: the id's registered limit, or ``max_steps`` where it registers none."""
    from rlspeed.core.tasks._episodes import mean_greedy_return

    standard = env_facts(cfg).max_episode_steps or cfg.max_steps
    return mean_greedy_return(lambda: make_env(cfg, standard), policy, cfg.eval_episodes, seed)


# Which algorithms fit, and the sizes the checks and networks need: from the env's spaces.
ANSWERS = SpaceAnswers("gym", env_facts)

SPEC = TaskSpec(
    name="gym",
    schema=GymTaskConfig,
    # Per env: check_algo judges each algorithm against the env's spaces.
    action_kind="the env's",
    make_env=make_env,
    make_functional=None,
    evaluate=evaluate,
    observation_bytes=ANSWERS.observation_bytes,
    network_inputs=ANSWERS.network_inputs,
    image_shape=ANSWERS.image_shape,
    tabular=ANSWERS.tabular(),
    settle=settle,
    validate=validate,
    check_algo=ANSWERS.check_algo,
)
