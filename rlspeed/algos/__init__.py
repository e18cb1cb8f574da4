"""Algorithms: one subpackage each, with ``SPEC`` in its ``__init__`` and one file per backend."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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
