"""The package's shape: no import circle among rlspeed's modules and the Optuna sweeper's,
and every import pointing down the layers docs/ARCHITECTURE.md draws.

Every import counts, wherever it is written (module top, inside a function, under
``TYPE_CHECKING``): a function-level import only hides a circle from Python, not from a
reader, who still has to hold both modules in mind to follow either.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlspeed", "hydra_plugins")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def project_files() -> dict[str, Path]:
    """Module name -> its file, for every module of ``PACKAGES``."""
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports. ``from a.b import c`` is an edge to
    ``a.b.c`` when that is a module, else to ``a.b``."""
    files = project_files()
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    for alias in node.names
                ]
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_circle() -> None:
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk found the code
    assert cycles(graph) == []


# docs/ARCHITECTURE.md's layers, top to bottom: (name, the modules and packages in it). A
# module may import its own layer's and any lower layer's; the most specific entry places it
# (``pkg.__init__``: the package's own module only).
LAYERS = [
    ("entry", ["rlspeed.__init__", "rlspeed.api", "rlspeed.cli", "rlspeed.preflight"]),
    ("entry", ["rlspeed.bench"]),
    ("entry", ["hydra_plugins"]),
    ("run", ["rlspeed.run", "rlspeed.seed_workers", "rlspeed.seed_training"]),
    ("recording", ["rlspeed.recording", "rlspeed.comparison", "rlspeed.host_records"]),
    ("checks", ["rlspeed.validation", "rlspeed.run_folders"]),
    ("mode=eval", ["rlspeed.evaluate"]),
    # Every algorithm package (rlspeed.core.algos.<name>); the entries below carve out the rest.
    ("algorithms", ["rlspeed.core.algos"]),
    (
        "RL pieces",
        [
            "rlspeed.core.algos.__init__",
            "rlspeed.core.algos.networks",
            "rlspeed.core.algos.schedule",
        ],
    ),
    ("RL pieces", [f"rlspeed.core.algos.{name}" for name in ("rollout", "rollout_jax", "replay")]),
    ("RL pieces", ["rlspeed.core.algos.replay_jax", "rlspeed.core.algos.encoding"]),
    ("RL pieces", ["rlspeed.core.algos.normalization"]),
    ("loops", ["rlspeed.core.algos.loops"]),
    ("parts", [f"rlspeed.core.{name}" for name in ("tasks", "engines", "envs", "backends")]),
    ("parts", ["rlspeed.tracking", "rlspeed.monitor", "rlspeed.seed_streams", "rlspeed.tables"]),
    ("parts", ["rlspeed.sweep", "rlspeed.slurm", "rlspeed.video"]),
    ("files", ["rlspeed.saved_config"]),
    ("files", ["rlspeed.checkpoint", "rlspeed.statefile", "rlspeed.digests"]),
    ("base", ["rlspeed.config_tree", "rlspeed.gym_ids"]),
    ("base", [f"rlspeed.{name}" for name in ("config", "registry", "errors", "secrets")]),
    ("base", ["rlspeed.core.__init__", "rlspeed.core.state", "rlspeed.core.heap"]),
    ("base", ["rlspeed.seeding", "rlspeed.machine", "rlspeed.user_modules"]),
    # Run by a peer's own Python, where rlspeed is not installed: it imports none of it.
    ("base", ["rlspeed.bench.peer_run"]),
]
LAYER_NAMES = list(dict.fromkeys(name for name, _ in LAYERS))


def layer_of(module: str) -> str | None:
    """The layer whose most specific entry names ``module`` or a package above it."""
    best: tuple[int, str] | None = None
    for name, entries in LAYERS:
        for entry in entries:
            package = entry.removesuffix(".__init__")
            if entry.endswith(".__init__") and module == package:
                return name
            inside = not entry.endswith(".__init__") and (module + ".").startswith(entry + ".")
            if inside and (best is None or len(entry) > best[0]):
                best = (len(entry), name)
    return best[1] if best else None


def test_every_import_points_down_the_documented_layers() -> None:
    graph = import_graph()
    unplaced = sorted(module for module in graph if layer_of(module) is None)
    assert unplaced == []  # a new module gets a layer here and in docs/ARCHITECTURE.md
    upward = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if LAYER_NAMES.index(str(layer_of(target))) < LAYER_NAMES.index(str(layer_of(module)))
    ]
    assert upward == []


def test_the_cycle_finder_sees_a_circle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# ---------------------------------------------------------------- the core apart from the shell

# The RL library: what a run trains with, usable without the tool around it.
CORE = ["rlspeed.core"]
# The plain modules the core builds on (schemas, errors, seeds, files of agents and state).
CORE_BASE = {
    f"rlspeed.{name}"
    for name in (
        "config",
        "errors",
        "registry",
        "secrets",
        "seeding",
        "machine",
        "user_modules",
        "checkpoint",
        "statefile",
        "digests",
    )
}
# What belongs to the tool around the core: the command line, configs, tracking, progress,
# sweeps, clusters.
SHELL_LIBRARIES = {"hydra", "omegaconf", "mlflow", "optuna", "rich", "tensorboard", "submitit"}
SHELL_LIBRARIES |= {"wandb"}


def in_core(module: str) -> bool:
    return any((module + ".").startswith(package + ".") for package in CORE)


def libraries_imported(module: str) -> set[str]:
    """The top-level names of every library ``module`` imports, wherever the import is
    written (``TYPE_CHECKING`` included: a reader of the core needs the shell's types
    otherwise)."""
    files = project_files()
    names: set[str] = set()
    for node in ast.walk(ast.parse(files[module].read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
            if node.module == "torch.utils" and any(a.name == "tensorboard" for a in node.names):
                names.add("tensorboard")
            if node.module.startswith("torch.utils.tensorboard"):
                names.add("tensorboard")
    return names


def core_closure(graph: dict[str, set[str]]) -> set[str]:
    """The core's modules and every project module they import, directly or not."""
    seen = {module for module in graph if in_core(module)}
    todo = list(seen)
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_core_imports_nothing_of_the_shell() -> None:
    graph = import_graph()
    closure = core_closure(graph)
    assert len([m for m in closure if in_core(m)]) > 30  # the walk found the core
    outside = sorted(m for m in closure if not in_core(m) and m not in CORE_BASE)
    assert outside == []  # a shell module the core reaches
    shell_imports = sorted(
        f"{module} imports {library}"
        for module in closure
        for library in libraries_imported(module) & SHELL_LIBRARIES
    )
    assert shell_imports == []


def test_the_shell_check_sees_a_shell_library_and_a_shell_module() -> None:
    graph = {"rlspeed.core.algos.x": {"rlspeed.config"}, "rlspeed.config": {"rlspeed.monitor"}}
    graph["rlspeed.monitor"] = set()
    assert "rlspeed.monitor" in core_closure(graph)
    assert "hydra" in libraries_imported("rlspeed.preflight")
    assert "tensorboard" in libraries_imported("rlspeed.tracking.tensorboard")
    assert "wandb" in libraries_imported("rlspeed.tracking.wandb")


def test_importing_the_core_loads_no_config_tracking_or_sweep_library() -> None:
    """At run time too: the core's modules imported in a fresh process load none of Hydra,
    OmegaConf, MLflow, Optuna, submitit or W&B (rich and TensorBoard are not asked of it: Flax
    imports rich itself)."""
    modules = [
        "rlspeed.core.algos.ppo.flax",
        "rlspeed.core.algos.dqn.torch",
        "rlspeed.core.algos.loops.fused_training",
        "rlspeed.core.algos.loops.host",
        "rlspeed.core.tasks.gym",
        "rlspeed.core.engines.gym_async",
        "rlspeed.core.engines.jax_vmap",
        "rlspeed.core.backends.torch",
    ]
    code = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'hydra', 'omegaconf', 'mlflow', 'optuna', 'submitit', 'wandb'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "[]"
