"""Backends: the library that holds the agent's parameters and does the updates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BackendSpec:
    name: str
    # (backend config, seed) -> None: seeds RNGs and sets threads/determinism.
    setup: Callable[[Any, int], None]
