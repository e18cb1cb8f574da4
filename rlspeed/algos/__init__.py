"""Algorithms: one subpackage each, with ``SPEC`` in its ``__init__`` and one file per backend."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlspeed.errors import ConfigError

# Range name -> (the test a hyperparameter must pass, what is allowed, as the error says it).
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (lambda value: value >= 1, "an integer >= 1"),
    "unit": (lambda value: 0.0 <= value <= 1.0, "a number in [0, 1]"),
    "positive": (lambda value: value > 0, "a number > 0"),
    "non_negative": (lambda value: value >= 0, "a number >= 0"),
    "off_at_zero": (lambda value: value >= 0, "a number >= 0 (0 turns it off)"),
}


def check_ranges(algo: Any, **keys_by_range: tuple[str, ...]) -> None:
    """Reject the first ``algo.<key>`` outside its range (a key of ``RANGES``), in the order
    given, with one ConfigError line."""
    for range_name, keys in keys_by_range.items():
        test, allowed = RANGES[range_name]
        for key in keys:
            if not test(algo[key]):
                raise ConfigError(f"algo.{key}", algo[key], allowed)


def check_batch_fits_buffer(algo: Any) -> None:
    if algo.batch_size > algo.buffer_size:
        raise ConfigError(
            "algo.batch_size", algo.batch_size, f"<= algo.buffer_size ({algo.buffer_size})"
        )


def _no_extra_checks(algo_cfg: Any, cfg: Any) -> None:
    return None


@dataclass(frozen=True)
class AlgoSpec:
    name: str
    schema: type
    # Action-space kinds the algorithm handles: "discrete", "continuous".
    action_kinds: tuple[str, ...]
    # backend name -> "module:function" of its train(ctx) entrypoint (imported lazily,
    # so a torch run never imports flax and the reverse).
    implementations: dict[str, str] = field(default_factory=dict)
    validate: Callable[[Any, Any], None] = _no_extra_checks
    # Tasks the algorithm is offered on (SPEC §4); None: every task whose action kind fits.
    tasks: tuple[str, ...] | None = None

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(sorted(self.implementations))

    def load(self, backend: str) -> Callable[..., Any]:
        module, _, function = self.implementations[backend].partition(":")
        return getattr(importlib.import_module(module), function)
