"""One registry per config group: rlspeed's own options, found in the modules of a package,
and the options of other installed packages, found through Python entry points.

Each module of a registered package exposes ``SPEC``: an object with a ``name`` equal to the
config option that selects it; shared code beside them is a private module (``_name``), or a
plain module in a package of subpackages. Adding an algorithm, task, engine, backend or
tracker is therefore one module plus one YAML file.

A package of one's own adds an option without a file in rlspeed: an entry point in one of
``PLUGIN_GROUPS`` named as the option, naming the spec (``SPEC`` of the same type) or a
module that has one. Only names are read until the option is chosen or the options are
listed; Hydra sees them through ``hydra_plugins/rlspeed_entry_points``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from rlspeed.errors import ConfigError, one_line

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

SpecT = TypeVar("SpecT")

# Entry-point group of each config group other packages may add options to.
PLUGIN_GROUPS = {
    "algo": "rlspeed.algos",
    "task": "rlspeed.tasks",
    "env": "rlspeed.engines",
    "tracking": "rlspeed.trackers",
}


# What a name registered for one call may be: an option's name on the command line.
_OPTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# A section of an entry_points.txt that declares a plug-in.
_PLUGIN_SECTION = re.compile(
    r"^\s*\[\s*(" + "|".join(re.escape(group) for group in PLUGIN_GROUPS.values()) + r")\s*\]",
    re.MULTILINE,
)


def _declared_on_path() -> bool:
    """Whether a distribution on ``sys.path`` may declare a plug-in: its entry_points.txt
    has one of the groups (an egg, or a folder that cannot be listed, may). Reading them is
    ~2 ms; importing importlib.metadata and reading every distribution with it ~20, which
    ``rlspeed --help`` and a plain run are spared where no plug-in is installed."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            if os.path.isfile(entry):
                return True  # a zip or an egg on the path: importlib.metadata reads it
            continue
        for name in names:
            if name.endswith(".egg"):
                return True
            if name.endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(entry or ".", name, "entry_points.txt")) as file:
                        if _PLUGIN_SECTION.search(file.read()):
                            return True
                except OSError:
                    continue  # no entry points
    return False


@functools.cache
def installed_plugins() -> dict[str, list[EntryPoint]]:
    """The entry points of every group in ``PLUGIN_GROUPS``, by group: names only, nothing
    imported. Read once per process (``forget_plugins`` reads them again)."""
    if not _declared_on_path():
        return {group: [] for group in PLUGIN_GROUPS.values()}
    from importlib.metadata import entry_points

    found = entry_points()
    return {group: list(found.select(group=group)) for group in PLUGIN_GROUPS.values()}


def describe(point: EntryPoint) -> str:
    """An entry point as an error names it: itself, its group and its distribution."""
    dist = getattr(point, "dist", None)
    owner = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"entry point '{point.name} = {point.value}' [{point.group}] of {owner}"


class Registry(Generic[SpecT]):
    """Maps option names of one config group to the specs that build them."""

    def __init__(self, group: str, package: str, spec_type: str, subpackages: bool = False) -> None:
        self.group = group
        self.package = package
        # "module:Class" of the specs (a plug-in's must be one), named: this module is
        # below theirs.
        self.spec_type = spec_type
        # True when each option is a subpackage (algorithms: one file per backend inside).
        self.subpackages = subpackages
        self.entry_point_group = PLUGIN_GROUPS.get(group)
        self._specs: dict[str, SpecT] | None = None
        # Plug-ins loaded so far, and specs registered for one call (``registered``).
        self._loaded: dict[str, SpecT] = {}
        self._given: dict[str, SpecT] = {}

    def _discover(self) -> dict[str, SpecT]:
        if self._specs is None:
            specs: dict[str, SpecT] = {}
            pkg = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(pkg.__path__):
                if info.name.startswith("_") or (self.subpackages and not info.ispkg):
                    continue  # shared code beside the options (importing it costs every start)
                module = importlib.import_module(f"{self.package}.{info.name}")
                spec: Any = getattr(module, "SPEC", None)
                if spec is not None:
                    specs[spec.name] = spec
            self._specs = specs
        return self._specs

    def _own_spec(self, name: str) -> SpecT | None:
        """The ``SPEC`` of the module named as option ``name`` (``-`` read as ``_``), or None
        where there is no such module or it holds another option."""
        module_name = f"{self.package}.{str(name).replace('-', '_')}"
        if not module_name.rpartition(".")[2].isidentifier():
            return None
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise  # the option's module exists but something it imports does not
            return None
        spec: Any = getattr(module, "SPEC", None)
        return spec if spec is not None and spec.name == name else None

    def _builtin(self, name: str) -> SpecT | None:
        spec = self._own_spec(name)
        return spec if spec is not None else self._discover().get(name)

    def is_builtin(self, name: str) -> bool:
        """Whether ``name`` is one of rlspeed's own options."""
        return self._builtin(name) is not None

    def _points(self, name: str | None = None) -> list[EntryPoint]:
        """The installed plug-ins' entry points (of option ``name`` alone, if given)."""
        if self.entry_point_group is None:
            return []
        points = installed_plugins()[self.entry_point_group]
        return [point for point in points if name is None or point.name == name]

    def plugin_names(self) -> list[str]:
        """The options other packages add (and those registered for this call), unloaded."""
        return sorted({point.name for point in self._points()} | set(self._given))

    def builtins(self) -> Iterator[SpecT]:
        """rlspeed's own options."""
        return iter(self._discover().values())

    def names(self) -> list[str]:
        return sorted(set(self._discover()) | set(self.plugin_names()))

    def __iter__(self) -> Iterator[SpecT]:
        """Every option: rlspeed's own, then the plug-ins (loaded now); a plug-in that cannot
        be chosen (it fails to load, or takes a name another option has) is left out."""
        yield from self.builtins()
        for name in self.plugin_names():
            if name not in self._discover():
                with contextlib.suppress(ConfigError):
                    yield self.get(name)

    def given(self, name: str) -> SpecT | None:
        """The spec registered as option ``name`` for this call (``registered``), if it is
        one: it exists in this process alone."""
        return self._given.get(name)

    def get(self, name: str) -> SpecT:
        """The spec of option ``name``, importing only its own module where that holds it:
        choosing an option loads nothing the others need (JAX, MuJoCo, MLflow). A plug-in
        is loaded on its first ``get``; one that fails, or takes a name another option
        has, is one ConfigError line naming its entry point."""
        if name in self._given:
            return self._given[name]
        points = self._points(name)
        spec = self._builtin(name)
        if spec is not None:
            if points:
                raise ConfigError(
                    self.group,
                    name,
                    f"a plug-in named other than rlspeed's own options: the "
                    f"{describe(points[0])} takes the name of rlspeed's {self.group}={name}",
                )
            return spec
        if len(points) > 1:
            raise ConfigError(
                self.group,
                name,
                f"one plug-in of that name: the {describe(points[0])} and the "
                f"{describe(points[1])} both take it",
            )
        if points:
            return self._load(points[0])
        raise ConfigError(self.group, name, f"one of {', '.join(self.names())}")

    def _load(self, point: EntryPoint) -> SpecT:
        if point.name in self._loaded:
            return self._loaded[point.name]

        def refuse(what: str) -> ConfigError:
            return ConfigError(
                self.group, point.name, f"a plug-in that loads: the {describe(point)} {what}"
            )

        try:
            loaded: Any = point.load()
        except (Exception, SystemExit) as error:  # a package's code: anything, exit included
            said = f"sys.exit({error.code!r})" if isinstance(error, SystemExit) else None
            raise refuse(f"failed to import ({said or one_line(error)})") from None
        spec: Any = getattr(loaded, "SPEC", None) if isinstance(loaded, ModuleType) else loaded
        module, _, cls = self.spec_type.partition(":")
        if not any(
            (kind.__module__, kind.__qualname__) == (module, cls) for kind in type(spec).__mro__
        ):
            raise refuse(f"names {type(spec).__name__}, not a {module}.{cls}")
        if spec.name != point.name:
            raise refuse(f"names the spec of {self.group}={spec.name}, not of its own name")
        checked: SpecT = spec  # its class is the registry's spec type (checked above)
        self._loaded[point.name] = checked
        return checked

    @contextlib.contextmanager
    def registered(self, spec: SpecT) -> Iterator[None]:
        """``spec`` is an option while the block runs (``rlspeed.train(task=<TaskSpec>)``);
        its name must be one no other option has."""
        name: str = getattr(spec, "name", "")
        if not _OPTION_NAME.fullmatch(name):
            allowed = "a name of letters, digits, '-', '_' and '.' (an option's name)"
            raise ConfigError(f"{self.group}.name", name, allowed)
        if name in self._given or self._builtin(name) is not None or self._points(name):
            taken = ", ".join(self.names())
            raise ConfigError(f"{self.group}.name", name, f"a name no option has yet ({taken})")
        self._given[name] = spec
        try:
            yield
        finally:
            del self._given[name]


def forget_plugins() -> None:
    """Read the installed plug-ins again (after a package was installed in this process)."""
    installed_plugins.cache_clear()
    for registry in (ALGOS, TASKS, ENGINES, BACKENDS, TRACKERS):
        registry._loaded.clear()


ALGOS: Registry[Any] = Registry(
    "algo", "rlspeed.core.algos", "rlspeed.core.algos:AlgoSpec", subpackages=True
)
TASKS: Registry[Any] = Registry("task", "rlspeed.core.tasks", "rlspeed.core.tasks:TaskSpec")
ENGINES: Registry[Any] = Registry("env", "rlspeed.core.engines", "rlspeed.core.engines:EngineSpec")
BACKENDS: Registry[Any] = Registry(
    "backend", "rlspeed.core.backends", "rlspeed.core.backends:BackendSpec"
)
TRACKERS: Registry[Any] = Registry("tracking", "rlspeed.tracking", "rlspeed.tracking:TrackerSpec")
