"""One registry per config group, filled by discovering the modules of a package.

Each module of a registered package exposes ``SPEC``: an object with a ``name``
equal to the config option that selects it; shared code beside them is a private module
(``_name``), or a plain module in a package of subpackages. Adding an algorithm, task, engine,
backend or tracker is therefore one module plus one YAML file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from rlspeed.errors import ConfigError

SpecT = TypeVar("SpecT")


class Registry(Generic[SpecT]):
    """Maps option names of one config group to the specs that build them."""

    def __init__(self, group: str, package: str, subpackages: bool = False) -> None:
        self.group = group
        self.package = package
        # True when each option is a subpackage (algorithms: one file per backend inside).
        self.subpackages = subpackages
        self._specs: dict[str, SpecT] | None = None

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

    def names(self) -> list[str]:
        return sorted(self._discover())

    def __iter__(self) -> Iterator[SpecT]:
        return iter(self._discover().values())

    def get(self, name: str) -> SpecT:
        """The spec of option ``name``, importing only its own module where that holds it:
        choosing an option loads nothing the others need (JAX, MuJoCo, MLflow)."""
        spec = self._own_spec(name)
        if spec is not None:
            return spec
        specs = self._discover()
        if name not in specs:
            raise ConfigError(self.group, name, f"one of {', '.join(self.names())}")
        return specs[name]


ALGOS: Registry[Any] = Registry("algo", "rlspeed.algos", subpackages=True)
TASKS: Registry[Any] = Registry("task", "rlspeed.tasks")
ENGINES: Registry[Any] = Registry("env", "rlspeed.engines")
BACKENDS: Registry[Any] = Registry("backend", "rlspeed.backends")
TRACKERS: Registry[Any] = Registry("tracking", "rlspeed.tracking")
