"""Options other packages add through entry points (rlspeed.registry, hydra_plugins/
rlspeed_entry_points): they compose with no YAML in rlspeed, an algorithm with only some
stacks refuses the others in one line, a plug-in that fails to import or takes a taken name
is one line, and ``rlspeed.train`` takes a task object. The example package
(examples/rlspeed_example) is installed into this environment and trained through the
command and the API."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

import rlspeed
from rlspeed.cli import CONF_DIR, set_up_config_tree
from rlspeed.config import RunConfig
from rlspeed.core.algos import AlgoSpec
from rlspeed.core.algos.qlearn import QLearnConfig
from rlspeed.core.algos.qlearn import validate as validate_qlearn
from rlspeed.errors import ConfigError, RLSpeedError
from rlspeed.preflight import check_overrides
from rlspeed.registry import ALGOS, ENGINES, TASKS, TRACKERS, forget_plugins
from tests.conftest import REPO_ROOT, assert_one_line_error, cli_env, run_cli

EXAMPLE = Path(REPO_ROOT) / "examples" / "rlspeed_example"


@dataclass(frozen=True)
class TableConfig(QLearnConfig):
    name: str = "zq"


def _qlearn_variant(name: str, learners: dict[str, str], fused: str | None) -> AlgoSpec:
    return AlgoSpec(
        name=name,
        schema=TableConfig,
        action_kinds=("discrete",),
        observation_kinds=("categorical",),
        learners=learners,
        fused=fused,
        validate=validate_qlearn,
    )


# Q-learning's parts, one stack each: what entry points of a test distribution name.
HOST_ONLY = _qlearn_variant(
    "zq-host", {"torch": "rlspeed.core.algos.qlearn.torch:TorchQTable"}, None
)
FUSED_ONLY = _qlearn_variant("zq-fused", {}, "rlspeed.core.algos.qlearn.flax:make_train")

# An engine and a tracker under names of their own.
ENGINE = dataclasses.replace(ENGINES.get("gym-sync"), name="my-sync")
TRACKER = dataclasses.replace(TRACKERS.get("none"), name="my-none")

ENTRY_POINTS = """\
[rlspeed.engines]
my-sync = tests.test_plugins:ENGINE

[rlspeed.trackers]
my-none = tests.test_plugins:TRACKER

[rlspeed.algos]
zq-host = tests.test_plugins:HOST_ONLY
zq-fused = tests.test_plugins:FUSED_ONLY
broken = rlspeed_no_such_module:SPEC
not-a-spec = json:dumps

[rlspeed.tasks]
cartpole = rlspeed.core.tasks.cartpole:SPEC
"""


def write_distribution(folder: Path) -> Path:
    """An installed distribution, as importlib.metadata finds one on the path: its metadata
    and entry points, no code."""
    info = folder / "rlspeed_test_plugins-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rlspeed-test-plugins\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return folder


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test distribution on this process's path (the registries read it again)."""
    monkeypatch.syspath_prepend(str(write_distribution(tmp_path / "site")))
    forget_plugins()
    set_up_config_tree()
    yield tmp_path / "site"
    forget_plugins()


def check(*overrides: str) -> RunConfig:
    return check_overrides([*overrides, "tracking=none"], [], CONF_DIR, showing=True).cfg


def test_a_plugin_algorithm_composes_and_refuses_the_stacks_it_lacks(plugins: Path) -> None:
    cfg = check("algo=zq-fused", "task=gridworld", "algo.alpha=0.25")
    assert (cfg.algo.name, cfg.algo.alpha, cfg.algo.gamma) == ("zq-fused", 0.25, 0.9)
    with pytest.raises(ConfigError) as refused:
        check("algo=zq-fused", "task=gridworld", "backend=torch", "env=gym-sync")
    assert str(refused.value) == (
        "rlspeed: invalid backend=torch env=gym-sync: expected a stack algo=zq-fused trains "
        "on: backend=flax env=jax-vmap"
    )
    with pytest.raises(ConfigError) as refused:
        check("algo=zq-host", "task=gridworld")  # flax + jax-vmap, the default stack
    assert str(refused.value).endswith("a stack algo=zq-host trains on: backend=torch with any env")
    assert ALGOS.get("zq-host") is HOST_ONLY
    assert {"zq-host", "zq-fused", "broken"} <= set(ALGOS.names())


def test_a_plugin_engine_and_tracker_compose(plugins: Path) -> None:
    cfg = check_overrides(
        ["env=my-sync", "tracking=my-none", "backend=torch", "algo=qlearn", "task=gridworld"],
        [],
        CONF_DIR,
        showing=True,
    ).cfg
    assert (cfg.env.name, cfg.num_envs, cfg.tracking.name) == ("my-sync", 8, "my-none")
    assert ENGINES.get("my-sync") is ENGINE and TRACKERS.get("my-none") is TRACKER


def test_a_plugin_that_fails_to_load_or_takes_a_taken_name_is_one_line(plugins: Path) -> None:
    where = "[rlspeed.algos] of rlspeed-test-plugins 0.1"
    with pytest.raises(ConfigError) as refused:
        ALGOS.get("broken")
    assert str(refused.value) == (
        "rlspeed: invalid algo=broken: expected a plug-in that loads: the entry point 'broken "
        f"= rlspeed_no_such_module:SPEC' {where} failed to import (ModuleNotFoundError: No "
        "module named 'rlspeed_no_such_module')"
    )
    with pytest.raises(ConfigError, match="names function, not a rlspeed.core.algos.AlgoSpec$"):
        ALGOS.get("not-a-spec")
    with pytest.raises(RLSpeedError, match="^rlspeed: invalid task=cartpole: .* takes the name of"):
        check("algo=dqn", "task=cartpole")
    # Listing the options leaves out what cannot be chosen, and fails on none of it.
    assert "broken" not in [spec.name for spec in ALGOS]
    assert "zq-host" in [spec.name for spec in ALGOS]


def test_the_command_names_a_plugin_that_fails_to_import_in_one_line(plugins: Path) -> None:
    done = run_cli(["algo=broken"], plugins, env={"PYTHONPATH": str(plugins)}, timeout=120)
    assert_one_line_error(
        done, "invalid algo=broken", "rlspeed-test-plugins 0.1", "ModuleNotFoundError"
    )


def test_train_takes_a_task_object_for_that_call_only(tmp_path: Path) -> None:
    grid = dataclasses.replace(TASKS.get("gridworld"), name="my-grid")
    # total_steps=0 is refused by the checks, after the config composed with the task.
    with pytest.raises(ConfigError, match="^rlspeed: invalid total_steps=0"):
        rlspeed.train(algo="qlearn", task=grid, tracking="none", total_steps=0, out_dir=tmp_path)
    assert "my-grid" not in TASKS.names()
    with pytest.raises(ConfigError, match="^rlspeed: invalid task.name=doors: expected a name"):
        rlspeed.train(algo="qlearn", task=dataclasses.replace(grid, name="doors"))
    with pytest.raises(ConfigError, match="^rlspeed: invalid task.name=my grid: expected a name"):
        rlspeed.train(algo="qlearn", task=dataclasses.replace(grid, name="my grid"))
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------ the example package


def install_example() -> None:
    """``pip install -e examples/rlspeed_example`` into this environment, unless this
    checkout's example is installed already; one install at a time (xdist workers)."""
    lock_path = Path(tempfile.gettempdir()) / "rlspeed-example-install.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            installed = distribution("rlspeed-example").read_text("direct_url.json") or "{}"
            if json.loads(installed).get("url") == EXAMPLE.as_uri():
                return
        except PackageNotFoundError:
            pass
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(EXAMPLE)]
        # Without build isolation the environment's setuptools builds it (no network); an
        # older setuptools needs the wheel package to, and pip then fetches the build's needs.
        done = subprocess.run([*pip, "--no-build-isolation"], capture_output=True, text=True)
        if done.returncode != 0:
            done = subprocess.run(pip, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]


RUN = ["backend=torch", "env=gym-sync", "tracking=none", "progress=none", "total_steps=1000"]


@pytest.mark.slow
def test_the_example_package_trains_through_the_command(tmp_path: Path) -> None:
    install_example()
    folder = tmp_path / "run"
    done = run_cli(["algo=xsarsa", "task=hallway", *RUN, f"hydra.run.dir={folder}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert (metrics["status"], metrics["env_steps"]) == ("FINISHED", 1000)
    assert metrics["score"] == 1.0  # the greedy policy walks the hallway to its end
    # Only the torch learner: the default stack (flax + jax-vmap) is refused in one line.
    refused = run_cli(["algo=xsarsa", "task=hallway"], tmp_path)
    assert_one_line_error(
        refused,
        "invalid backend=flax env=jax-vmap: expected a stack algo=xsarsa trains on: "
        "backend=torch with any env",
    )
    listed = run_cli(["--help"], tmp_path)
    assert "xsarsa" in listed.stdout and "hallway" in listed.stdout


API_SCRIPT = """
import dataclasses, json, sys
import rlspeed
from rlspeed_example import hallway

run = dict(backend="torch", env="gym-sync", tracking="none", progress="none", total_steps=1000)
named = rlspeed.train(algo="xsarsa", task="hallway", out_dir=sys.argv[1] + "/named", **run)
longer = dataclasses.replace(hallway.SPEC, name="long-hallway")
given = rlspeed.train(algo="xsarsa", task=longer, out_dir=sys.argv[1] + "/given",
                      **{"task.length": 4}, **run)
print(json.dumps({
    "named": [named.score, named.metrics["status"], named.metrics["env_steps"]],
    "given": [given.score, given.metrics["status"], given.metrics["env_steps"]],
    "right": int(named.agent.act(0)), "given_task": str(given.agent.config.task.name),
}))
"""


@pytest.mark.slow
def test_the_example_package_trains_through_the_api(tmp_path: Path) -> None:
    install_example()
    done = subprocess.run(
        [sys.executable, "-c", API_SCRIPT, str(tmp_path)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["named"] == [1.0, "FINISHED", 1000]
    assert result["given"] == [1.0, "FINISHED", 1000]
    assert result["right"] == 1  # from the first cell, the learned greedy action walks right
    assert result["given_task"] == "long-hallway"
