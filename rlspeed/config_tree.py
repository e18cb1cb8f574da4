"""The config tree as Hydra composes it: the schemas stored in Hydra's ConfigStore, a
composed config's YAML and flat keys, Hydra's quoting of a value, and the probes the checks
use (can a folder be created, does a database answer). The checks themselves:
``rlspeed.validation``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from rlspeed.config import RunConfig, plain
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS, TASKS
from rlspeed.secrets import mask, mask_value, reveal


def schema_node(schema: type) -> DictConfig:
    """A schema as a node of the config tree: its dataclasses are frozen (a run's checked
    config never changes), the node of them takes values (overrides, a YAML option's)."""
    node = OmegaConf.structured(schema)

    def writable(container: DictConfig) -> None:
        OmegaConf.set_readonly(container, None)
        for key in container:
            child = container._get_node(key)
            if isinstance(child, DictConfig):
                writable(child)

    writable(node)
    return node


# A run logs at least this many rows unless log_every is given (a short run of a pair whose
# interval suits its full length still draws a curve).
MIN_LOGGED_ROWS = 20


def default_log_every(every: int, total_steps: int) -> int:
    """``${rlspeed_log_every:N}``, the default ``log_every`` of conf/: N env steps, or fewer
    where ``total_steps`` would log fewer than MIN_LOGGED_ROWS rows. A value given on the
    command line replaces the interpolation, so it is kept as given."""
    return max(1, min(int(every), int(total_steps) // MIN_LOGGED_ROWS))


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore, and the resolver of the default log_every;
    YAML options build on them. (The command line's resolver also keeps a resumed run's
    interval: rlspeed.cli.set_up_config_tree.)"""
    OmegaConf.register_new_resolver(
        "rlspeed_log_every",
        lambda every, _root_: default_log_every(every, _root_.total_steps),
        replace=True,
    )
    store = ConfigStore.instance()
    store.store(name="rlspeed_schema", node=schema_node(RunConfig))
    for registry in (ALGOS, TASKS):
        for spec in registry.builtins():
            store.store(
                group=f"schema/{registry.group}", name=spec.name, node=schema_node(spec.schema)
            )


def quote(text: str) -> str:
    """``text`` as a quoted string of Hydra's override grammar (``key='...'``): taken as
    it is, whatever characters it holds."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def to_yaml(cfg: RunConfig) -> str:
    """The run's config.yaml, passwords in URLs masked."""
    return mask(OmegaConf.to_yaml(plain(cfg)))


def flatten(cfg: RunConfig | DictConfig) -> dict[str, Any]:
    """Dotted keys to leaf values, as MLflow params; passwords in URLs masked, as in the
    saved config.yaml this is compared with (resume=). ``cfg``: a run's checked config, or
    a config.yaml read back."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = mask_value(node)

    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else plain(cfg)
    walk(tree, "")
    return flat


# Bytes of one file or folder name on Linux's file systems.
NAME_MAX = 255


def uncreatable(folder: Path) -> tuple[Path, str] | None:
    """(where, why) when nothing can be created in ``folder`` or, where it does not exist
    yet, in its nearest existing ancestor; None when something can.

    Creates nothing that stays: it makes and removes a scratch folder there, which also tests
    what permission bits cannot (``root`` passes every ``os.access`` check, yet cannot create
    anything in /proc or on a read-only mount).
    """
    existing = folder.expanduser().absolute()
    for part in existing.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return existing, f"a name of {len(os.fsencode(part)):,} bytes, more than {NAME_MAX}"
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlspeed-check-", dir=existing))
    except OSError as error:  # not a folder, read-only, no permission
        return existing, error.strerror or type(error).__name__
    return None


def unreachable(database_url: str, timeout_s: int = 5) -> str | None:
    """Why a database server (PostgreSQL, MySQL) cannot be connected to, in one line; None
    when it answers. Creates nothing."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    url = reveal(database_url)
    engine = create_engine(url, connect_args={"connect_timeout": timeout_s})
    try:
        with engine.connect():
            return None
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", None) or error).strip()
        return (reason.splitlines() or [type(error).__name__])[0][:200]
    finally:
        engine.dispose()


def check_creatable(key: str, value: object, folder: Path, allowed: str) -> None:
    """Raise ConfigError unless ``folder`` exists and takes new files, or can be created."""
    problem = uncreatable(folder)
    if problem is not None:
        where, why = problem
        raise ConfigError(key, value, f"{allowed} ({where}: {why})")
