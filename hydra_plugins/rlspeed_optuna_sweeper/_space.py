"""From the sweeper's config to Optuna objects, checking everything a user can get wrong:
the search space (``params`` entries in Hydra's override sweep syntax, each an Optuna
distribution: ``_distributions``), the sampler, the pruner (their numbers' bounds:
``_bounds``) and the objectives.

:func:`build` is used twice: by the CLI's pre-flight check (one clear line, before any
trial) and by the sweeper itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from hydra.errors import HydraException
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from hydra_plugins.rlspeed_optuna_sweeper._bounds import (
    MAX_TRIALS,
    PRUNER_BOUNDS,
    SAMPLER_BOUNDS,
    check_bounds,
    sweeper_bounds,
)
from hydra_plugins.rlspeed_optuna_sweeper._distributions import (
    SYNTAX,
    choice_value,
    distribution,
    legacy_distribution,
)
from hydra_plugins.rlspeed_optuna_sweeper._seeding import trial_seed
from rlspeed.config_tree import quote
from rlspeed.errors import RLSpeedError

# The numbers of a run's metrics.json (rlspeed.run._write_metrics) a study can optimize.
METRICS = (
    "score",
    "rolling_step_reward",
    "recent_return",
    "env_steps",
    "gradient_updates",
    "wall_time_s",
    "env_steps_per_s",
    "updates_per_s",
)
_ABSENT = object()


class SweepConfigError(RLSpeedError):
    """A sweeper setting that cannot work; one line, before any trial."""


@dataclass
class SearchSpace:
    """Optuna distributions per override key, plus the keys fixed for every trial."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    # key -> override value text, for keys that do not vary.
    fixed: dict[str, str] = field(default_factory=dict)
    # key -> {categorical value -> override value text}.
    choice_texts: dict[str, dict[Any, str]] = field(default_factory=dict)

    def overrides(self, params: dict[str, Any]) -> list[str]:
        """Hydra overrides for one trial's parameter values (fixed keys first)."""
        lines = [f"{key}={text}" for key, text in self.fixed.items() if key not in params]
        for key, value in params.items():
            texts = self.choice_texts.get(key, {})
            lines.append(f"{key}={texts[value] if value in texts else value_text(value)}")
        return lines

    def extremes(self) -> list[list[str]]:
        """Trial overrides that together reach both ends of every range and every choice,
        one key at a time from all-lowest: the pre-flight check validates each, so a value
        outside a key's allowed range is named before any trial runs."""
        ends = {key: _ends(dist) for key, dist in self.distributions.items()}
        lowest = {key: values[0] for key, values in ends.items()}
        variants = [self.overrides(lowest)]
        for key, values in ends.items():
            variants += [self.overrides({**lowest, key: value}) for value in values[1:]]
        return variants


def composition_signature(
    distributions: dict[str, BaseDistribution], params: dict[str, Any]
) -> frozenset[tuple[str, Any]]:
    """What decides whether a trial's overrides compose: its keys, each choice's value and
    each number's kind. Trials alike in it compose alike (a number inside a range composes
    as any other of that range does; the pre-flight check composed both ends of each), so
    a sweep composes one trial of each to check it (Hydra's composition, ~0.2 s a trial)."""
    return frozenset(
        (key, repr(params[key]) if isinstance(dist, CategoricalDistribution) else type(dist))
        for key, dist in distributions.items()
    )


def _ends(dist: BaseDistribution) -> list[Any]:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return [dist.low, dist.high]


@dataclass
class SweepSetup:
    """Everything the sweeper needs that a config can get wrong, checked."""

    space: SearchSpace
    directions: list[str]
    # metrics.json names, one per direction; None: the job's return value.
    objectives: list[str] | None
    sampler: Any
    pruner: Any
    # Pruner config as plain data (with _target_), for the jobs to rebuild it.
    pruner_cfg: dict[str, Any]
    custom_search_space: Any
    # Why the configured pruner is off (for the sweep's log), or None.
    pruner_off: str | None = None
    # With a seed: the sampler seeded for trial ``number`` (_seeding); else None.
    sampler_for: Callable[[int], Any] | None = None


def value_text(value: Any) -> str:
    """A Python value as a Hydra override value."""
    if isinstance(value, str):
        return quote(value) if _needs_quotes(value) else value
    return Override._get_value_element_as_str(value)


def _needs_quotes(text: str) -> bool:
    try:
        parsed = OverridesParser.create().parse_override(f"k={text}")
    except HydraException:
        return True
    return parsed.is_sweep_override() or parsed.value() != text


def _key_exists(cfg: DictConfig, key: str) -> bool:
    if key.startswith(("+", "~")) or "/" in key or "@" in key:
        return True  # additions, deletions and nested config groups: Hydra checks them
    groups = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    if key in groups:  # a group without a node of its own, such as hparams
        return True
    return OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False) is not _ABSENT


def search_space(
    cfg: DictConfig,
    params: dict[str, str] | None,
    arguments: list[str],
    legacy: dict[str, Any] | None = None,
) -> SearchSpace:
    """Parse ``search_space`` (legacy), ``params`` and the command line's overrides, in that
    order (a later entry for the same key wins); every key must exist in ``cfg``."""
    space = SearchSpace()
    parser = OverridesParser.create()
    entries: list[tuple[str, str]] = [
        (f"hydra.sweeper.params.{key}", f"{key}={value}") for key, value in (params or {}).items()
    ]
    entries += [("command line", line) for line in arguments]

    def forget(key: str) -> None:
        for table in (space.distributions, space.fixed, space.choice_texts):
            table.pop(key, None)

    for key, spec in (legacy or {}).items():
        if not _key_exists(cfg, key):
            _unknown_key(key, "hydra.sweeper.search_space")
        try:
            space.distributions[key] = legacy_distribution(spec)
        except (KeyError, TypeError, ValueError) as error:
            raise SweepConfigError(
                f"rlspeed: invalid hydra.sweeper.search_space.{key}={_flat(spec)}: "
                f"expected {{type: float|int|categorical, low, high, step, log, choices}} ({error})"
            ) from None
    for where, line in entries:
        try:
            override = parser.parse_override(line)
        except HydraException as error:
            raise SweepConfigError(
                f"rlspeed: invalid {where}: '{line}' is not Hydra sweep syntax "
                f"({_first_line(error)}); expected {SYNTAX}"
            ) from None
        key = override.get_key_element()
        if not _key_exists(cfg, key):
            _unknown_key(
                key, "the command line" if where == "command line" else "hydra.sweeper.params"
            )
        current = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        try:
            dist = distribution(override, current)
        except (ValueError, TypeError, HydraException) as error:
            raise SweepConfigError(
                f"rlspeed: invalid {where}: '{line}' cannot be searched ({_first_line(error)}); "
                f"expected {SYNTAX}"
            ) from None
        forget(key)
        if dist is None:
            space.fixed[key] = override.get_value_element_as_str()
            continue
        space.distributions[key] = dist
        sweep = override.value()
        if isinstance(sweep, ChoiceSweep):
            space.choice_texts[key] = dict(choice_value(v) for v in sweep.list)
    return space


def build(sweeper: DictConfig, cfg: DictConfig, arguments: list[str]) -> SweepSetup:
    """Check the sweeper's config against the composed ``cfg``; raise one clear line."""
    space = search_space(cfg, sweeper.params, arguments, sweeper.search_space)
    if not space.distributions and not sweeper.custom_search_space:
        raise SweepConfigError(
            "rlspeed: invalid hydra.sweeper.params: nothing to search; give at least one "
            f"key a sweep ({SYNTAX}), e.g. hparams=dqn_search"
        )
    direction = sweeper.direction
    directions = (
        list(direction) if isinstance(direction, (list, tuple, ListConfig)) else [direction]
    )
    for value in directions:
        if value not in ("maximize", "minimize"):
            raise SweepConfigError(
                f"rlspeed: invalid hydra.sweeper.direction={value}: expected maximize or "
                "minimize, or a list of them for a multi-objective study"
            )
    check_bounds("hydra.sweeper.", sweeper, sweeper_bounds(sweeper.heartbeat_s))
    report_every = sweeper.get("report_every")
    custom = None
    if sweeper.custom_search_space:
        try:
            custom = get_method(sweeper.custom_search_space)
        except Exception as error:  # noqa: BLE001 - any import failure is the user's path
            raise SweepConfigError(
                "rlspeed: invalid hydra.sweeper.custom_search_space="
                f"{sweeper.custom_search_space}: expected the dotted path of a function "
                f"(cfg, trial) -> None ({_first_line(error)})"
            ) from None
    check_bounds("hydra.sweeper.sampler.", sweeper.sampler, SAMPLER_BOUNDS)
    sampler = _instantiate("sampler", sweeper.sampler, space)
    sampler_for = None
    # A grid sampler shuffles its points by its seed: its trials must share one order (a
    # trial's grid id names a point of it), and it picks unvisited points itself.
    grid = str(sweeper.sampler.get("_target_", "")).endswith("GridSampler")
    if (seed := sweeper.sampler.get("seed")) is not None and not grid:  # see _seeding

        def sampler_for(number: int) -> Any:
            return _instantiate("sampler", sweeper.sampler, space, seed=trial_seed(seed, number))

    # Keyword arguments of the pruner: string keys.
    pruner_cfg = cast(dict[str, Any], OmegaConf.to_container(sweeper.pruner, resolve=True))
    assert isinstance(pruner_cfg, dict)
    hyperband = str(pruner_cfg.get("_target_")).endswith("HyperbandPruner")
    if hyperband and pruner_cfg.get("min_resource") is None:  # resources are env steps
        pruner_cfg["min_resource"] = report_every or 1
    check_bounds("hydra.sweeper.pruner.", pruner_cfg, PRUNER_BOUNDS)
    _check_resources(pruner_cfg)
    pruner = _instantiate("pruner", OmegaConf.create(pruner_cfg), space)
    objectives = _objectives(sweeper, directions, is_rlspeed_run="trial" in cfg)
    pruner_off = None
    if type(pruner).__name__ != "NopPruner":
        if len(directions) > 1:
            pruner_off = "Optuna cannot prune a multi-objective study"
        elif objectives not in (None, ["score"]):  # the trials report their score
            pruner_off = f"a pruner judges the score, the objective is {objectives[0]}"
    if pruner_off is not None:
        pruner_off += f": the {type(pruner).__name__} is off"
        pruner_cfg = {"_target_": "optuna.pruners.NopPruner"}
        pruner = instantiate(pruner_cfg)
    return SweepSetup(
        space, directions, objectives, sampler, pruner, pruner_cfg, custom, pruner_off, sampler_for
    )


def _check_resources(pruner: dict[str, Any]) -> None:
    """Hyperband's and successive halving's rungs run from min_resource to max_resource env
    steps (Optuna fails on the reverse in a trial)."""
    low, high = pruner.get("min_resource"), pruner.get("max_resource")
    if isinstance(high, int) and isinstance(low, int) and high < low:
        raise SweepConfigError(
            f"rlspeed: invalid hydra.sweeper.pruner.max_resource={high}: expected auto or an "
            f"integer >= min_resource ({low})"
        )


def _objectives(
    sweeper: DictConfig, directions: list[str], is_rlspeed_run: bool
) -> list[str] | None:
    """The checked ``objectives`` key: metrics.json names, one per direction."""
    names = sweeper.get("objectives")
    if names is None:
        if len(directions) > 1 and is_rlspeed_run:  # a run returns its score alone
            raise SweepConfigError(
                f"rlspeed: invalid hydra.sweeper.objectives=null: expected "
                f"{len(directions)} metric names for direction=[{','.join(directions)}], one per "
                f"direction, e.g. [score,wall_time_s]; allowed: {', '.join(METRICS)}"
            )
        return None
    names = [str(name) for name in names]  # the schema makes it a list
    wrong = [name for name in names if name not in METRICS]
    if wrong or len(names) != len(directions):
        why = f"unknown name {wrong[0]}" if wrong else f"direction=[{','.join(directions)}]"
        raise SweepConfigError(
            f"rlspeed: invalid hydra.sweeper.objectives=[{','.join(names)}]: expected "
            f"{len(directions)} of {', '.join(METRICS)}, one per direction ({why})"
        )
    return names


def _instantiate(what: str, node: DictConfig, space: SearchSpace, **kwargs: Any) -> Any:
    """The sampler or pruner ``node`` describes, with ``kwargs`` for its arguments."""
    target = node.get("_target_", "")
    if target.endswith("GridSampler") and node.get("search_space") is None:
        kwargs["search_space"] = _grid(space)
    try:
        return instantiate(node, **kwargs)
    except Exception as error:  # noqa: BLE001 - Optuna's own message says what is wrong
        cause = error.__cause__ or error
        raise SweepConfigError(
            f"rlspeed: invalid hydra.sweeper.{what} ({target}): {_first_line(cause)}"
        ) from None


def _grid(space: SearchSpace) -> dict[str, list[Any]]:
    """The grid sampler's values of each key: its params' choices and ranges. Each point
    is a trial: a grid of more than MAX_TRIALS points (range(0, 10**10)) is refused before
    it is listed."""
    sizes = {key: _grid_size(key, dist) for key, dist in space.distributions.items()}
    if (points := math.prod(sizes.values())) > MAX_TRIALS:
        raise SweepConfigError(
            f"rlspeed: invalid hydra/sweeper/sampler=grid: expected a grid of at most "
            f"{MAX_TRIALS:,} points (a trial each); the params make {points:,}"
        )
    grid: dict[str, list[Any]] = {}
    for key, dist in space.distributions.items():
        if isinstance(dist, CategoricalDistribution):
            grid[key] = list(dist.choices)
        elif isinstance(dist, IntDistribution):
            grid[key] = list(range(dist.low, dist.high + 1, dist.step))
        else:
            assert isinstance(dist, FloatDistribution) and dist.step is not None
            grid[key] = [dist.low + i * dist.step for i in range(sizes[key])]
    return grid


def _grid_size(key: str, dist: BaseDistribution) -> int:
    """How many values of ``key`` a grid has."""
    if isinstance(dist, CategoricalDistribution):
        return len(dist.choices)
    if isinstance(dist, IntDistribution) and not dist.log:
        return (dist.high - dist.low) // dist.step + 1
    if isinstance(dist, FloatDistribution) and dist.step is not None:
        return round((dist.high - dist.low) / dist.step) + 1
    raise SweepConfigError(
        f"rlspeed: invalid hydra.sweeper.params.{key}: the grid sampler needs choice() "
        "or range() values, not an interval"
    )


def _unknown_key(key: str, where: str) -> None:
    raise SweepConfigError(
        f"rlspeed: unknown key '{key}' in {where}: it is not in the config "
        "(see rlspeed --cfg job; prefix it with + to add a new key)"
    )


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _flat(value: Any) -> str:
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value)
    return " ".join(str(value).split())
