"""The first trial of a new study: the run's own composed config.

A search that cannot reach the score of the config it starts from is worse than no search,
and the sampler's first trials are random draws. So, with ``hydra.sweeper.enqueue_defaults``
(true by default), a sweep that opens a study with no trials yet enqueues one trial with
the composed value of every searched key (the config the same command without ``-m`` would
run: the algorithm's and the task's defaults, ``conf/algo_task`` and plain command-line
overrides applied), which the sweep's first ``ask`` then takes (the first lane of a batch,
the first job of a parallel launch). A resumed study already has trials and is not given
another. A key whose composed value lies outside its distribution (or that has none: a
``+key`` addition) is left to the sampler, and the sweep's log says so in one line; a grid
sampler visits every point itself, so it gets no extra trial.
"""

from __future__ import annotations

import logging
from typing import Any

import optuna
from omegaconf import DictConfig, ListConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from hydra_plugins.rlspeed_optuna_sweeper._space import SearchSpace, value_text
from rlspeed.sweep import database_lock, storage_engine

log = logging.getLogger(__name__)
_ABSENT = object()


def composed_value(config: DictConfig, key: str) -> Any:
    """The value ``key`` has in the composed ``config`` (a config group's key: the selected
    option's name), as plain Python; ``_ABSENT`` for a key added (``+key``) or deleted."""
    if key.startswith(("+", "~")):
        return _ABSENT
    choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
    if key in choices:
        return choices[key]
    value = OmegaConf.select(config, key, default=_ABSENT, throw_on_missing=False)
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def inside(dist: BaseDistribution, value: Any) -> Any:
    """``value`` as ``dist`` holds it (a categorical's own choice, an int or a float), or
    ``_ABSENT`` when ``dist`` cannot take it."""
    if isinstance(dist, CategoricalDistribution):
        for choice in dist.choices:
            if _same(choice, value):
                return choice
        return _ABSENT
    if not _is_number(value):
        return _ABSENT
    assert isinstance(dist, IntDistribution | FloatDistribution)
    if isinstance(dist, IntDistribution):
        if not float(value).is_integer():
            return _ABSENT
        value = int(value)
    else:
        value = float(value)
    return value if dist._contains(dist.to_internal_repr(value)) else _ABSENT


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(choice: Any, value: Any) -> bool:
    """A categorical choice and a composed value are one: equal numbers (32 and 32.0), else
    the same override text (lists and dicts are categories by their text)."""
    if _is_number(choice) and _is_number(value):
        return bool(choice == value)
    if _is_number(choice) or _is_number(value):
        return False
    return value_text(choice) == value_text(value)


def describe(dist: BaseDistribution) -> str:
    """A distribution as the sweep's log line names it."""
    if isinstance(dist, CategoricalDistribution):
        return "choice(" + ", ".join(map(str, dist.choices)) + ")"
    assert isinstance(dist, IntDistribution | FloatDistribution)
    scale = ", log" if dist.log else f", step {dist.step}" if dist.step not in (None, 1) else ""
    return f"[{dist.low}, {dist.high}{scale}]"


def default_params(config: DictConfig, space: SearchSpace) -> tuple[dict[str, Any], list[str]]:
    """The composed value of each searched key that its distribution holds, and, for every
    other key, why it is not among them."""
    params: dict[str, Any] = {}
    left: list[str] = []
    for key, dist in space.distributions.items():
        value = composed_value(config, key)
        held = _ABSENT if value is _ABSENT else inside(dist, value)
        if held is not _ABSENT:
            params[key] = held
        elif value is _ABSENT:
            left.append(f"{key} (no composed value)")
        else:
            left.append(f"{key}={value_text(value)} (outside {describe(dist)})")
    return params, left


def enqueue_defaults(
    study: optuna.Study, storage: Any, config: DictConfig, space: SearchSpace, sampler: Any
) -> dict[str, Any] | None:
    """Enqueue the composed values of the searched keys as the first trial of ``study`` if it
    has no trials yet (under the study's lock, so that two sweeps starting together on a
    database server do not both); the values enqueued, or None."""
    if isinstance(sampler, optuna.samplers.GridSampler):
        return None
    lock = database_lock(storage_engine(storage), f"study:{study.study_name}")
    with lock:
        if study.get_trials(deepcopy=False):
            return None
        params, left = default_params(config, space)
        if left:
            log.warning(
                "rlspeed: the first trial takes the run's defaults except for %s: the "
                "sampler chooses %s",
                "; ".join(left),
                "it" if len(left) == 1 else "them",
            )
        if not params:
            return None
        study.enqueue_trial(params)
    log.info(
        "The study's first trial takes the run's defaults: %s",
        ", ".join(f"{key}={value_text(value)}" for key, value in params.items()),
    )
    return params
