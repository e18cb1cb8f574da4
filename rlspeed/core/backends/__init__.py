"""Backends: the library that holds the agent's parameters and does the updates."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlspeed.errors import ConfigError

if TYPE_CHECKING:
    from rlspeed.config import BackendConfig

DEVICES = "auto, cpu, cuda or cuda:N"
# backend.devices: a count above this is a typo (a node has at most tens of accelerators).
MAX_DEVICES = 1024


def device_setting(cfg: BackendConfig) -> str:
    """``backend.device``; auto for the config of a run folder written before it existed
    (``mode=eval`` reads those as they are)."""
    return str(getattr(cfg, "device", "auto"))


def gpu_index(device: str) -> int | None:
    """The GPU that ``cuda`` or ``cuda:N`` names (0 or N); None for any other setting."""
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    return int(match.group(1) or 0) if match else None


def check_device(cfg: BackendConfig, gpus: Callable[[], int]) -> None:
    """Refuse ``backend.device`` unless it is one of ``DEVICES`` and a GPU it names exists
    (``gpus()``: how many the backend's library sees; loaded only when a GPU is named)."""
    device = device_setting(cfg)
    if device in ("auto", "cpu"):
        return
    index = gpu_index(device)
    if index is None:
        raise ConfigError("backend.device", device, DEVICES)
    count = gpus()
    if index >= count:
        seen = f"{count} GPU{'s' if count != 1 else ''}" if count else "no GPU"
        raise ConfigError("backend.device", device, f"auto or cpu: {cfg.name} sees {seen}")


def check_devices(cfg: BackendConfig, fused: bool) -> None:
    """Refuse ``backend.devices`` unless it is all or a count in [1, MAX_DEVICES], and a
    count above 1 where the run is not one fused program (whose lanes it spreads)."""
    devices = cfg.devices
    if devices == "all":
        return
    if isinstance(devices, str) or not 1 <= devices <= MAX_DEVICES:
        raise ConfigError("backend.devices", devices, f"all, or a count in [1, {MAX_DEVICES:,}]")
    if devices > 1 and not fused:
        allowed = "all or 1: devices spread the lanes of a fused run (backend=flax env=jax-vmap)"
        raise ConfigError("backend.devices", devices, allowed)


@dataclass(frozen=True)
class BackendSpec:
    name: str
    # (backend config, seed) -> None: seeds RNGs and sets threads/determinism.
    setup: Callable[[BackendConfig, int], None]
    # Raises ConfigError for settings the backend cannot run with (backend.device).
    check: Callable[[BackendConfig], None] = lambda cfg: None
    # (backend config) -> the device the agent's arrays are on, as the summary shows it.
    device_name: Callable[[BackendConfig], str] = lambda cfg: "cpu"
    # (backend config) -> the GPUs a run's seed workers spread over (``backend.seed_workers``):
    # 0 where the agent lives on the CPU, 1 where the config names one GPU.
    worker_gpus: Callable[[BackendConfig], int] = lambda cfg: 0
