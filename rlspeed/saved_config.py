"""A run folder's ``config.yaml``, read back as rlspeed runs write it (``resume=``,
``checkpoint=``): whole (its SHA256SUMS digest), at most ``CONFIG_BYTES``, resolved (no
interpolation, which could read the environment) and naming no module this process has not
imported (a folder never makes rlspeed import code)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlspeed import digests
from rlspeed.checkpoint import CONFIG_BYTES, CONFIG_FILE, IDENTITY_KEYS, why
from rlspeed.config_tree import flatten
from rlspeed.errors import ConfigError


def read_config(key: str, value: str, folder: Path) -> Any:
    """The ``config.yaml`` in ``folder`` (of ``key=value``: resume, checkpoint) as rlspeed
    runs write it: whole (its digest), resolved (no interpolation, which could read the
    environment) and naming no module this process has not imported; one ConfigError line
    otherwise."""
    path = folder / CONFIG_FILE
    try:
        digests.check(path, CONFIG_BYTES, f"run's {CONFIG_FILE}")
        saved = OmegaConf.load(path)
        if not isinstance(saved, DictConfig):
            raise ValueError("a list, not a mapping of keys")
        if where := _interpolation(saved):
            raise ValueError(f"{where} is an interpolation; rlspeed writes values")
        flat = flatten(saved)
    except Exception as error:  # damaged, not YAML, not a mapping
        raise ConfigError(key, value, f"a readable {CONFIG_FILE} ({why(error)})") from None
    if missing := [name for name in IDENTITY_KEYS if name not in flat]:
        raise ConfigError(
            key, value, f"a {CONFIG_FILE} as rlspeed runs write (it has no {missing[0]})"
        )
    for name, module in _named_modules(saved.task):
        if module not in sys.modules:
            raise ConfigError(
                key,
                value,
                f"a run whose task.{name}={saved.task[name]} names a module imported already "
                f"({module} is not): rlspeed imports no module a run folder names (from "
                f"Python: import {module} first)",
            )
    return saved


def _interpolation(node: Any, prefix: str = "") -> str | None:
    """The first key of ``node`` (a DictConfig or ListConfig) whose value is an
    interpolation, or None."""
    keys = node.keys() if OmegaConf.is_dict(node) else range(len(node))
    for key in keys:
        if OmegaConf.is_interpolation(node, key):
            return f"{prefix}{key}"
        child = node._get_node(key)
        if (OmegaConf.is_dict(child) or OmegaConf.is_list(child)) and (
            found := _interpolation(child, f"{prefix}{key}.")
        ):
            return found
    return None


def _named_modules(task: Any) -> list[tuple[str, str]]:
    """(key, module) of each module making the task's env would import: ``task.import``,
    and the ``module:`` of a Gymnasium id written ``module:Env-v0`` (``gym.make`` imports
    it)."""
    named = [("import", task.get("import"))]
    env_id = task.get("id")
    if isinstance(env_id, str) and ":" in env_id:
        named.append(("id", env_id.split(":")[0]))
    return [(key, str(module)) for key, module in named if module]
