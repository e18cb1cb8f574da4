"""Shared by the tasks of a JAX library's envs (``task=gymnax``, ``task=playground``): the
Gymnasium face of the task's twin for the Gymnasium engines, and the greedy score at the
env's own episode limit. Each task binds them to its own functions with ``partial`` (module
functions: gym-async pickles ``make_env`` to its workers). Gymnasium and NumPy load when an
env is built, not when the task is chosen."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

if TYPE_CHECKING:
    import gymnasium as gym

    from rlspeed.core.envs.vmap import FunctionalEnv
    from rlspeed.core.tasks import Policy


class FacedSettings(Protocol):
    """What these read of a task's settings (``max_steps`` settled to an int by then)."""

    @property
    def max_steps(self) -> int | None: ...
    @property
    def eval_episodes(self) -> int: ...


Settings = TypeVar("Settings", bound=FacedSettings)


def face_env(make_functional: Callable[[Settings], FunctionalEnv], cfg: Settings) -> gym.Env:
    """The twin's Gymnasium face, with ``task.max_steps`` as its time limit."""
    from gymnasium.wrappers import TimeLimit

    from rlspeed.core.envs.gym_face import FunctionalGymEnv

    # Settled and checked: an int.
    return TimeLimit(FunctionalGymEnv(make_functional(cfg)), cast(int, cfg.max_steps))


def standard_settings(own_limit: Callable[[Settings], int], cfg: Settings) -> Settings:
    """The settings a score is measured at: the env's own episode limit."""
    return dataclasses.replace(cfg, max_steps=own_limit(cfg))  # type: ignore[type-var]


def face_score(
    make_env: Callable[[Settings], gym.Env],
    own_limit: Callable[[Settings], int],
    cfg: Settings,
    policy: Policy,
    seed: int,
) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` episodes at the env's
    own episode limit, on the twin's Gymnasium face."""
    from rlspeed.core.tasks._episodes import mean_greedy_return

    standard = standard_settings(own_limit, cfg)
    return mean_greedy_return(lambda: make_env(standard), policy, cfg.eval_episodes, seed)
