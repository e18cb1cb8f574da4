"""Probe MDPs with closed-form values (``rlspeed/core/envs/probe.py`` has them): ``task.kind``
picks one, ``task.actions`` and ``task.observations`` its spaces, so that every algorithm
has probes its spaces fit. What they are for: checking an algorithm's targets against the
exact answer (tests/test_probes.py), not scoring it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import AlgoKinds, Policy, TabularSpec, TaskSpec, check_settings
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS

# Gymnasium (and NumPy) load when an env is built or scored, not when a config is checked.
if TYPE_CHECKING:
    from types import ModuleType

    import gymnasium as gym
    import jax

    from rlspeed.core import XpArray

# Written here as well as in rlspeed/core/envs/probe.py, which loads Gymnasium and NumPy.
KINDS = ("constant", "observation", "discount", "action", "truncation", "alternation")
ACTIONS = ("discrete", "continuous")
OBSERVATIONS = ("continuous", "categorical")
# How a space kind is named to a user.
ACTION_NAMES = {"discrete": "Discrete(2)", "continuous": "Box(-1, 1, (1,))"}
OBSERVATION_NAMES = {"continuous": "Box(-1, 1, (1,))", "categorical": "Discrete(2)"}


@dataclass(frozen=True)
class ProbeTaskConfig(TaskConfig):
    name: str = "probe"
    # constant, observation, discount, action, truncation or alternation
    # (rlspeed/core/envs/probe.py).
    kind: str = "constant"
    # discrete: Discrete(2); continuous: Box(-1, 1, (1,)).
    actions: str = "discrete"
    # continuous: Box(-1, 1, (1,)); categorical: Discrete(2), a tabular state.
    observations: str = "continuous"
    # The time limit: the episode length of the truncation and alternation probes (2 or
    # more for alternation); the others end sooner (the discount probe needs 2 steps).
    max_steps: int = 4
    # Greedy episodes behind each score (mean return, at these settings).
    eval_episodes: int = 10


def make_env(cfg: ProbeTaskConfig) -> gym.Env:
    import gymnasium as gym

    import rlspeed.core.envs  # noqa: F401  (registers rlspeed/Probe-v0)

    return gym.make(
        "rlspeed/Probe-v0",
        kind=cfg.kind,
        actions=cfg.actions,
        observations=cfg.observations,
        max_episode_steps=cfg.max_steps,
    )


def make_functional(cfg: ProbeTaskConfig) -> Any:
    from rlspeed.core.envs.probe_jax import ProbeFunctional

    return ProbeFunctional(kind=cfg.kind, actions=cfg.actions, observations=cfg.observations)


def _check_choices(cfg: ProbeTaskConfig) -> None:
    for key, allowed in (("kind", KINDS), ("actions", ACTIONS), ("observations", OBSERVATIONS)):
        value = getattr(cfg, key)
        if value not in allowed:
            raise ConfigError(f"task.{key}", value, f"one of {', '.join(allowed)}")


def validate(cfg: ProbeTaskConfig) -> None:
    _check_choices(cfg)
    check_settings(cfg)
    if cfg.kind in ("discount", "alternation") and cfg.max_steps < 2:
        # A probe whose state 1 an episode of 1 step never reaches.
        allowed = f"an integer >= 2 with task.kind={cfg.kind} (its episodes visit 2 states)"
        raise ConfigError("task.max_steps", cfg.max_steps, allowed)


def check_algo(cfg: ProbeTaskConfig, algo: AlgoKinds) -> None:
    """Refuse an algorithm that cannot work with the probe's spaces, naming the setting
    (checked before the task's own settings: a space that is no choice is named first)."""
    _check_choices(cfg)
    if cfg.actions not in algo.action_kinds:
        key, value, names = "actions", cfg.actions, ACTION_NAMES
        needs = algo.action_kinds
    elif cfg.observations not in algo.observation_kinds:
        key, value, names = "observations", cfg.observations, OBSERVATION_NAMES
        needs = algo.observation_kinds
    else:
        return
    fits = [
        other.name
        for other in ALGOS
        if cfg.actions in other.action_kinds
        and cfg.observations in other.observation_kinds
        and (other.tasks is None or "probe" in other.tasks)
    ]
    raise ConfigError(
        "algo",
        algo.name,
        f"an algorithm for task.{key}={value} ({names[value]}; {algo.name} needs "
        f"task.{key}={' or '.join(needs)}): {', '.join(fits)}",
    )


def evaluate(cfg: ProbeTaskConfig, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` episodes at the run's own
    settings (a probe has no standard ones)."""
    from rlspeed.core.tasks._episodes import mean_greedy_return

    return mean_greedy_return(lambda: make_env(cfg), policy, cfg.eval_episodes, seed)


def evaluate_on_device(
    cfg: ProbeTaskConfig, act: Callable[[jax.Array], jax.Array], key: jax.Array
) -> jax.Array:
    """``evaluate`` on the JAX twin."""
    from rlspeed.core.envs.vmap import VmapEnv, mean_greedy_return

    env = VmapEnv(make_functional(cfg), cfg.eval_episodes, cfg.max_steps)
    return mean_greedy_return(env, act, key)


def state_index(cfg: ProbeTaskConfig, obs: XpArray, xp: ModuleType) -> Any:
    """The categorical observation is the state already."""
    return obs.astype(xp.int32)


SPEC = TaskSpec(
    name="probe",
    schema=ProbeTaskConfig,
    # Per settings: check_algo judges each algorithm against task.actions and observations.
    action_kind="the settings'",
    make_env=make_env,
    make_functional=make_functional,
    evaluate=evaluate,
    evaluate_on_device=evaluate_on_device,
    # One float32 or one int32.
    observation_bytes=lambda cfg: 4,
    # The number, or the state one-hot.
    network_inputs=lambda cfg: 1 if cfg.observations == "continuous" else 2,
    tabular=TabularSpec(num_states=lambda cfg: 2, state_index=state_index),
    validate=validate,
    check_algo=check_algo,
    truncates_only_at_time_limit=True,
)
