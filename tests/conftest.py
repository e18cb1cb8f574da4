"""Shared helpers: the real ``rlspeed`` CLI in a subprocess, and in-process runs."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from rlspeed import statefile
from rlspeed.checkpoint import RESUME_FILE, seed_file
from rlspeed.cli import CONF_DIR, check_command_line
from rlspeed.config import BackendConfig
from rlspeed.config_tree import register_configs
from rlspeed.core.tasks.gridworld import GridWorldTaskConfig

# pytest-xdist runs one worker per core: one torch thread each (in-process runs and the
# CLI subprocesses alike) keeps them from oversubscribing the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# One XLA compilation cache (backend.compilation_cache) per test session, never the user's:
# the xdist workers inherit the controller's, so a program compiled once serves them all.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="rlspeed-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)

RLSPEED = str(Path(sys.executable).with_name("rlspeed"))
# This checkout, first on the CLI's path: its code and its Hydra plugins (hydra_plugins/),
# whichever checkout the installed package points at.
REPO_ROOT = str(Path(__file__).resolve().parents[1])

# Small seeded budget shared by the fast runs (learning starts early, logs often).
SMALL = [
    "total_steps=4000",
    "log_every=1000",
    "eval_every=2000",
    "algo.learning_starts=500",
    "algo.buffer_size=5000",
    "algo.batch_size=32",
    "algo.hidden_sizes=[32]",
    "progress=plain",
]


# Speeds, which differ between runs that compute the same thing; every other metric must not.
RATES = ("charts/SPS", "charts/updates_per_second")


def without_rates(row: dict[str, float]) -> dict[str, float]:
    # With several seeds, a rate's spread over them (<rate>_std) goes too.
    return {key: value for key, value in row.items() if key.removesuffix("_std") not in RATES}


def logged_rows(folder: Path) -> list[dict[str, float]]:
    """Every row a run logged (its resume state keeps them all), rates aside."""
    history = statefile.load(folder / RESUME_FILE)["monitor"]["history"]
    return [without_rates(row) for row in history]


def saved_agent(folder: Path, seed: int | None = None) -> bytes | Any:
    """A run's checkpoint as a comparable value: a flax checkpoint's bytes; a torch
    checkpoint's contents with every tensor as a list (networks and optimisers alike).
    ``seed``: that seed's file of a host-driven run of several seeds (torch)."""
    if (folder / "checkpoint.msgpack").exists():
        return (folder / "checkpoint.msgpack").read_bytes()
    import torch

    def plain(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [plain(item) for item in value]
        return value

    path = folder / "checkpoint.pt"
    return plain(torch.load(path if seed is None else seed_file(path, seed), weights_only=True))


def run_in(directory: Path, monkeypatch: pytest.MonkeyPatch, cfg: DictConfig) -> dict[str, Any]:
    """Run ``cfg`` in-process with ``directory`` (new) as its working folder, where the run
    writes; its metrics.json."""
    from rlspeed.checkpoint import read_metrics
    from rlspeed.run import run

    directory.mkdir()
    monkeypatch.chdir(directory)
    run(cfg)
    return read_metrics(directory)


def vouch(folder: Path) -> None:
    """Vouch for a run folder's files as they are now, as rlspeed's refusal of an unlisted
    or edited file tells a user to: ``sha256sum`` them into its SHA256SUMS."""
    names = sorted(
        p.name for p in folder.iterdir() if p.is_file() and p.name not in ("SHA256SUMS",)
    )
    listing = subprocess.run(
        ["sha256sum", *names], cwd=folder, check=True, capture_output=True, text=True
    ).stdout
    (folder / "SHA256SUMS").write_text(listing)


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the CLI runs in: this checkout first on the path, no caller's store."""
    # The tests choose their own MLflow store; the caller's must not leak in.
    full_env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full_env.update(env or {})
    paths = [REPO_ROOT, *filter(None, full_env.get("PYTHONPATH", "").split(os.pathsep))]
    full_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return full_env


def headless_env(**values: str) -> dict[str, str]:
    """The CLI's environment on a machine without a display: no DISPLAY, and no MUJOCO_GL or
    PyOpenGL platform (rlspeed's to choose) unless given."""
    env = cli_env(values)
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM"):
        if name not in values:
            env.pop(name, None)
    return env


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    """Run the installed ``rlspeed`` command; returns the CompletedProcess."""
    return subprocess.run(
        [RLSPEED, *args], cwd=cwd, env=cli_env(env), capture_output=True, text=True, timeout=timeout
    )


def start_cli(
    args: list[str],
    cwd: Path,
    preexec_fn: Callable[[], None] | None = None,
    **popen: object,
) -> subprocess.Popen:
    """Start the installed ``rlspeed`` command in the background (stdout piped, as text).

    SIGINT starts at its default, as in a terminal: a shell's background job (the suite run
    with ``&``) starts with SIGINT ignored, and Python then installs no Ctrl-C handler."""

    def prepare() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if preexec_fn is not None:
            preexec_fn()

    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen(
        [RLSPEED, *args], cwd=cwd, env=cli_env(), text=True, preexec_fn=prepare, **popen
    )


def wait_for_log(
    process: subprocess.Popen, folder: Path, pattern: str, text: str, timeout: float = 180
) -> Path:
    """The first ``rlspeed.log`` under ``folder`` matching ``pattern`` (a glob) that holds
    ``text``, once one does: a sweep's trials keep their progress lines in their own log
    files (its console has one line per trial)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in sorted(folder.glob(pattern)):
            if text in log.read_text(errors="replace"):
                return log
        assert process.poll() is None, f"the command ended before {text!r} in {pattern}"
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in {folder}/{pattern} within {timeout} s")


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input: exit code 2 and exactly one stderr line holding every fragment."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def refused_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line the command's check (``check_command_line``, what ``rlspeed``
    runs before Hydra starts) refuses ``args`` with, in this process: exit code 2, one line."""
    with pytest.raises(SystemExit) as stop:
        check_command_line(args)
    stderr = capsys.readouterr().err
    assert stop.value.code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def slow_but(fast: Any, cases: list[Any]) -> list[Any]:
    """Parametrize cases with all but ``fast`` marked slow: the default selection keeps one
    case (the fastest stack's), ``pytest -m slow`` runs the others."""

    def values(case: Any) -> tuple:
        return case if isinstance(case, tuple) else (case,)

    return [
        case if case == fast else pytest.param(*values(case), marks=pytest.mark.slow)
        for case in cases
    ]


def script_sources(page: str) -> list[str]:
    """The ``src`` of every ``<script>`` tag of an HTML page: the files it loads to run
    (scripts' own text, where "src=" may well occur, is not looked into)."""
    from html.parser import HTMLParser

    sources: list[str] = []

    class Scripts(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            sources.extend(v or "" for k, v in attrs if tag == "script" and k == "src")

    Scripts().feed(page)
    return sources


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def _mujoco_gl_as_it_was() -> Any:
    """rlspeed.train sets MUJOCO_GL for its process (rlspeed.machine.choose_mujoco_gl), here
    the test process: each test gets the variable back as it found it, so a later test's
    MuJoCo is not drawn through EGL (PyOpenGL imported, logging into a closed capture)."""
    before = os.environ.get("MUJOCO_GL")
    yield
    if before is None:
        os.environ.pop("MUJOCO_GL", None)
    else:
        os.environ["MUJOCO_GL"] = before


@pytest.fixture(scope="session")
def make_cfg() -> Callable[[list[str]], DictConfig]:
    """Compose the real config tree with overrides, as the CLI does."""
    register_configs()

    def _compose(overrides: list[str]) -> DictConfig:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            return compose(config_name="config", overrides=overrides)

    return _compose


def learner_cfg(algo: Any, **run: Any) -> DictConfig:
    """What a learner reads of a run's config: ``algo`` (a schema dataclass or a config of
    one), ``backend`` (torch's default settings: ``device`` auto) and run-level settings
    such as ``total_steps``, ``num_envs`` (1 unless given) and ``task`` (GridWorld's
    defaults unless given: what sizes a Q-table, and a replay buffer's longest episode)."""
    backend = OmegaConf.structured(BackendConfig(name="torch"))
    task = OmegaConf.structured(GridWorldTaskConfig())
    defaults = {"backend": backend, "num_envs": 1, "task": task}
    return OmegaConf.create({"algo": OmegaConf.structured(algo), **defaults, **run})


def assert_carried_noise_restarts_and_resumes(learner: Any, fresh: Any) -> None:
    """A replay learner of three envs that has acted a few steps with OU exploration (TD3's
    noise, SAC's draws): where an env's episode ended (the second) its carried noise is
    back at 0, the others' kept; ``fresh`` (another learner) loads it from the resume state."""
    before = np.asarray(learner.noise).copy()
    assert np.abs(before).min() > 0
    learner.episodes_ended(np.array([False, True, False]))
    after = np.asarray(learner.noise)
    np.testing.assert_array_equal(after[1], 0.0)
    np.testing.assert_array_equal(after[[0, 2]], before[[0, 2]])
    fresh.load_state_dict(learner.state_dict())
    np.testing.assert_array_equal(np.asarray(fresh.noise), after)


def assert_ou_moments(
    draw: Callable[[np.ndarray, np.ndarray, Any], tuple[np.ndarray, np.ndarray]],
    algo: Any,
    steps: int,
    variance: float,
) -> None:
    """``draw`` (TD3's ``draw_noise``, SAC's ``draw_normal``) with OU exploration, run
    ``steps`` steps from 0 for 20,000 envs: it acts with what it carries, the last step's
    variance is ``variance``, and neighbouring steps correlate by a = 1 - theta dt times
    their std ratio."""
    rng = np.random.default_rng(0)
    carried = np.zeros((20_000, 1))
    history = []
    for _ in range(steps):
        drawn, carried = draw(carried, rng.standard_normal(carried.shape), algo)
        np.testing.assert_array_equal(drawn, carried)
        history.append(carried[:, 0])
    assert np.var(history[-1]) == pytest.approx(variance, rel=0.05)
    correlation = np.corrcoef(history[-2], history[-1])[0, 1]
    kept = 1 - algo.ou_theta * algo.ou_dt
    assert correlation == pytest.approx(kept * np.sqrt(np.var(history[-2]) / variance), abs=0.01)
