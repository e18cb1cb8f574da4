"""Tasks: one module each exposing ``SPEC``, with its config schema and its factories."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from rlspeed.config import MAX_STEPS
from rlspeed.errors import ConfigError

if TYPE_CHECKING:
    import jax

    from rlspeed.config import TaskConfig
    from rlspeed.core.envs.vmap import FunctionalEnv

# A batched greedy policy: observations [B, ...] -> actions [B] (NumPy arrays). Tasks load
# NumPy and Gymnasium only to build or score an env: a config check reads no array.
Policy = Callable[[Any], Any]


def _always(cfg: TaskConfig) -> bool:
    return True


@dataclass(frozen=True)
class TabularSpec:
    """How a task's observations map to a finite state index (for tabular algorithms)."""

    # (task cfg) -> number of discrete states
    num_states: Callable[[Any], int]
    # (task cfg, observations [B, ...], xp) -> int32 state indices [B] in [0, num_states);
    # xp is numpy or jax.numpy, so one function serves the NumPy and the jitted JAX paths.
    state_index: Callable[[Any, Any, Any], Any]
    # (task cfg) -> number of actions (a Q-table's columns) where the settings decide it
    # (task=gym); None where it is a few moves, which the table's memory check leaves out.
    num_actions: Callable[[Any], int] | None = None
    # (task cfg) -> whether the observations at these settings are categorical (one-hot
    # encoded for the networks); task=gym: the id's observation space decides.
    categorical: Callable[[Any], bool] = _always


# Episode lengths are int32 on jax-vmap; a greedy evaluation builds all its episodes' envs
# at once.
MAXIMUMS = {"max_steps": MAX_STEPS, "eval_episodes": 10_000}


def _as_given(cfg: TaskConfig) -> TaskConfig:
    """A task's settings as they are: nothing is left to its env."""
    return cfg


def _none_traced(cfg: TaskConfig) -> dict[str, float]:
    """A task whose settings are all constants of the fused program."""
    return {}


def _with_nothing(cfg: TaskConfig, values: Mapping[str, Any]) -> TaskConfig:
    assert not values, f"the task traces no setting: {sorted(values)}"
    return cfg


def _no_image(cfg: TaskConfig) -> None:
    """``TaskSpec.image_shape`` of a task whose observations are never images."""
    return None


def check_settings(cfg: TaskConfig, **minimums: int) -> None:
    """Reject the first ``task.<key>`` out of its range: ``max_steps`` and, on tasks that have
    it, ``eval_episodes`` in [1, MAXIMUMS], then the task's own ``minimums`` (e.g. a grid's
    size; memory bounds it from above)."""
    for key, low in {"max_steps": 1, "eval_episodes": 1, **minimums}.items():
        high = MAXIMUMS.get(key)
        value = getattr(cfg, key, None)  # a setting the task has
        if value is not None and (value < low or (high is not None and value > high)):
            allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high:,}]"
            raise ConfigError(f"task.{key}", value, allowed)


class AlgoKinds(Protocol):
    """What a task's ``check_algo`` reads of an algorithm's spec (a
    ``rlspeed.core.algos.AlgoSpec``, a layer above the tasks')."""

    @property
    def name(self) -> str: ...
    @property
    def action_kinds(self) -> tuple[str, ...]: ...
    @property
    def observation_kinds(self) -> tuple[str, ...]: ...


class ScoredSettings(Protocol):
    """What ``mean_return_on_device`` reads of a task's settings."""

    @property
    def max_steps(self) -> int: ...
    @property
    def eval_episodes(self) -> int: ...


Settings = TypeVar("Settings", bound=ScoredSettings)


def mean_return_on_device(
    make_functional: Callable[[Settings], FunctionalEnv], standard: Callable[[Settings], Settings]
) -> Callable[[Settings, Callable[[jax.Array], jax.Array], jax.Array], jax.Array]:
    """``TaskSpec.evaluate_on_device`` of a task scored as the mean greedy return over
    ``eval_episodes`` episodes at the settings ``standard(cfg)``, on its JAX twin."""

    def evaluate_on_device(
        cfg: Settings, act: Callable[[jax.Array], jax.Array], key: jax.Array
    ) -> jax.Array:
        from rlspeed.core.envs.vmap import VmapEnv, mean_greedy_return

        scored = standard(cfg)
        env = VmapEnv(make_functional(scored), cfg.eval_episodes, scored.max_steps)
        return mean_greedy_return(env, act, key)

    return evaluate_on_device


@dataclass(frozen=True)
class TaskSpec:
    name: str
    schema: type
    # "discrete" or "continuous" actions (where check_algo is set, the env's spaces decide).
    action_kind: str
    # Gymnasium env for training, with the config's time limit (max_steps).
    make_env: Callable[[Any], Any]
    # Functional JAX twin (gymnasium FuncEnv) for the jax-vmap engine, or None.
    make_functional: Callable[[Any], Any] | None
    # Score of a greedy policy at the task's standard settings (the sweep objective).
    evaluate: Callable[[Any, Policy, int], float]
    # Bytes of one observation at these settings, for the pre-flight memory estimate; worked
    # out from the settings, never by building the env (a huge grid would not fit).
    observation_bytes: Callable[[Any], int]
    # Width of the network's input at these settings: the observation's entries, times the
    # classes of each where they are one-hot encoded (rlspeed.core.algos.encoding); also worked
    # out from the settings. backend.threads=auto sizes the network's products with it.
    network_inputs: Callable[[Any], int]
    # ``evaluate`` on the task's JAX twin, for the fused path and its checkpoints: (task cfg,
    # greedy actions of observations [B, ...] as a traceable function, JAX key) -> score.
    # Every seed's agent is then scored in one vmapped program; None: ``evaluate`` on the
    # host scores them one by one.
    evaluate_on_device: Callable[[Any, Callable[[Any], Any], Any], Any] | None = None
    # Finite state index of an observation, or None when the task has no tabular form.
    tabular: TabularSpec | None = None
    # The settings with what they leave to the env filled in, before ``validate`` checks
    # them (task=gym: ``max_steps: null`` as the id's registered limit).
    settle: Callable[[Any], Any] = _as_given
    # Raises ConfigError for settings the task cannot run with.
    validate: Callable[[Any], None] = check_settings
    # Where the spaces depend on the settings (task=gym): (task cfg, algo spec) -> raises
    # ConfigError naming the space the algorithm cannot work with; it then decides in place
    # of ``action_kind``.
    check_algo: Callable[[Any, Any], None] | None = None
    # True where the rolling step reward is the task's training metric and its score a step
    # reward ratio (Doors); elsewhere the score is a mean return, plotted beside the returns.
    step_reward: bool = False
    # True where only the time limit (task.max_steps) truncates an episode: a replay buffer
    # then keeps few final observations (``rlspeed.core.algos.replay.final_capacity``). False,
    # the safe answer for an env that may truncate itself, keeps one per transition.
    truncates_only_at_time_limit: bool = False
    # True where the Gymnasium env itself runs JAX (task=gymnax's face of its twin): JAX's
    # threads do not survive a fork, so gym-async starts its workers with spawn.
    env_runs_jax: bool = False
    # The settings that are inputs of the fused program, not constants compiled into it, by
    # name (task=gymnax: ``params.<name>``, its env params that can be): runs differing only
    # in them share one program, and a sweep's trials over them are lanes of one.
    traced: Callable[[Any], dict[str, float]] = _none_traced
    # (settings, {name: value}) -> the settings with those traced values (tracers, inside
    # the program).
    with_traced: Callable[[Any, Mapping[str, Any]], Any] = _with_nothing
    # (H, W, C) of image observations at these settings (a Box of rank 3), which
    # ``algo.network=auto`` sends through a conv torso (``rlspeed.core.algos.networks``);
    # None for any other. Worked out from the settings too.
    image_shape: Callable[[Any], tuple[int, int, int] | None] = _no_image
