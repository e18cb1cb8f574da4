"""Hydra's side of rlspeed's plug-ins: a config source that offers every installed plug-in
(``rlspeed.registry.PLUGIN_GROUPS``) as an option of its config group, and the search path
plugin that puts it behind rlspeed's own ``conf/``.

Listing an option reads only entry-point names; composing it loads the plug-in and turns its
spec into the node a YAML option of the group would give: an algorithm's or a task's schema
dataclass (as ``conf/algo/<name>.yaml`` selects ``schema/algo/<name>``), an engine's name
with the Gymnasium engines' ``num_envs``, a tracker's name.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf

SCHEME = "rlspeed-entry-points"
# A plug-in engine's default width (``num_envs=N`` sets another), as conf/env/gym-*.yaml's.
ENGINE_NUM_ENVS = 8


@functools.cache
def _registries() -> dict[str, Any]:
    """The registries of the groups plug-ins add to, by config group."""
    from rlspeed.registry import ALGOS, ENGINES, PLUGIN_GROUPS, TASKS, TRACKERS

    registries = {registry.group: registry for registry in (ALGOS, TASKS, ENGINES, TRACKERS)}
    assert set(registries) == set(PLUGIN_GROUPS)
    return registries


def _names(group: str) -> list[str]:
    """The plug-ins' options of ``group`` (none for the groups they do not add to)."""
    registry = _registries().get(group)
    return registry.plugin_names() if registry is not None else []


class EntryPointOptions(ConfigSource):
    """``<group>/<name>`` for each plug-in of the groups other packages may add to."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def _split(self, config_path: str) -> tuple[str, str]:
        group, _, name = config_path.rstrip("/").removesuffix(".yaml").rpartition("/")
        return group, name

    def is_group(self, config_path: str) -> bool:
        return bool(_names(config_path.strip("/")))

    def is_config(self, config_path: str) -> bool:
        group, name = self._split(config_path)
        return name in _names(group)

    def available(self) -> bool:
        return True

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        path = config_path.strip("/")
        if path == "":
            groups = [group for group in _registries() if _names(group)]
            return sorted(groups) if results_filter in (None, ObjectType.GROUP) else []
        return _names(path) if results_filter in (None, ObjectType.CONFIG) else []

    def load_config(self, config_path: str) -> ConfigResult:
        from rlspeed.config_tree import schema_node

        group, name = self._split(config_path)
        spec = _registries()[group].get(name)  # one ConfigError line if it cannot load
        package = None
        config: DictConfig
        if group in ("algo", "task"):
            config = schema_node(spec.schema)
            config.name = name
        elif group == "env":
            package = "_global_"
            config = OmegaConf.create({"env": {"name": name}, "num_envs": ENGINE_NUM_ENVS})
        else:
            config = OmegaConf.create({"name": name})
        return ConfigResult(
            provider="rlspeed plug-ins",
            path=f"{SCHEME}://{self.path}",
            config=config,
            header={"package": package},
        )


class EntryPointSearchPath(SearchPathPlugin):
    """Puts the plug-ins' options behind rlspeed's conf/ (its own options come first), in
    rlspeed's config tree only."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from rlspeed.cli import CONF_DIR

        conf = os.path.realpath(CONF_DIR)
        for element in search_path.get_path():
            path = element.path.removeprefix("file://")
            if element.provider == "main" and os.path.realpath(path) == conf:
                search_path.append("rlspeed plug-ins", f"{SCHEME}://")
                return
