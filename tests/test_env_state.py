"""A Gymnasium env's state in a resume file (``rlspeed.core.engines.env_state``): saved exactly
where its attributes are plain values (lists, tuples and dicts of them included) or its
``rlspeed_get_state`` / ``rlspeed_set_state`` hook hands them over; anything else makes its
runs unresumable, which the command says in one line at start (``checkpoint_every`` other
than 0 and ``resume=`` refused, ``auto`` off)."""

from __future__ import annotations

import io
import os
import pickle
import signal
import subprocess
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

import tests.data.stateful_envs  # noqa: F401 - registers the stateful/ ids
from rlspeed import statefile
from rlspeed.core.engines.env_state import (
    SAVED_STATE,
    env_state,
    restore_saved,
    unsaved_state,
)
from rlspeed.registry import TASKS
from tests.conftest import (
    logged_rows,
    refused_line,
    run_cli,
    saved_agent,
    start_cli,
)

STATEFUL = ["task=gym", "task.import=tests.data.stateful_envs", "tracking=none", "progress=plain"]
# Tiny DQN on the walks: the cut lands after the first logged row, 1,250 steps before the end.
DQN = [
    "algo=dqn",
    "backend=torch",
    "num_envs=4",
    "total_steps=1500",
    "algo.hidden_sizes=[16]",
    "algo.learning_starts=200",
    "algo.buffer_size=1000",
    "algo.batch_size=32",
    "algo.target_network_frequency=200",
    "log_every=250",
    "eval_every=1000",
]
UNSAVED = "keeps state in trail (a deque) that rlspeed cannot save"


class Thing:
    """An object of an env's own."""


@pytest.mark.parametrize(
    ("value", "unsaved"),
    [
        ([1, 2.5, None, "a", True, np.int64(3), np.zeros(2)], None),
        ({"cell": 1, 3: (4, [5.0]), ("a", 1): {"$x": False}}, None),
        (np.array(["a", "b"]), None),
        (deque([1]), "a deque"),
        ([1, Thing()], "a list holding a Thing"),
        ({"a": [deque()]}, "a dict holding a list holding a deque"),
        (defaultdict(int), "a defaultdict"),  # would read back as a plain dict
        (np.array([Thing()], dtype=object), "a NumPy object array"),
    ],
)
def test_what_a_resume_file_holds_exactly(value: Any, unsaved: str | None) -> None:
    env = gym.make("stateful/ListWalk-v0")
    env.reset(seed=0)
    env.unwrapped.extra = value  # type: ignore[attr-defined]
    assert unsaved_state(env) == (None if unsaved is None else f"extra ({unsaved})")


def test_a_hook_stands_for_its_layer_and_must_return_plain_values() -> None:
    env = gym.make("stateful/HookedDequeWalk-v0")
    env.reset(seed=0)
    assert unsaved_state(env) is None  # its deque is the hook's to hand over
    walk = env.unwrapped
    walk.rlspeed_get_state = lambda: {"trail": walk.trail}  # type: ignore[attr-defined]
    assert unsaved_state(env) == "HookedDequeWalk.rlspeed_get_state() (a dict holding a deque)"


def _task_env(name: str) -> gym.Env:
    spec = TASKS.get(name)
    return spec.make_env(OmegaConf.structured(spec.schema))


def _gym_env(env_id: str) -> gym.Env:
    return gym.make(env_id)


# Common Gymnasium ids, the walks and the built-in tasks (what each keeps: a tuple for
# MountainCar, lists for Blackjack and Doors' walls, a transition table of dicts of lists of
# tuples for FrozenLake, MuJoCo data for HalfCheetah).
ENVS = [
    *[
        (_gym_env, env_id)
        for env_id in (
            "CartPole-v1",
            "Acrobot-v1",
            "MountainCar-v0",
            "Pendulum-v1",
            "FrozenLake-v1",
            "Blackjack-v1",
            "HalfCheetah-v5",
            "stateful/ListWalk-v0",
            "stateful/DictWalk-v0",
            "stateful/HookedDequeWalk-v0",
        )
    ],
    *[(_task_env, name) for name in ("doors", "gridworld", "cartpole", "pendulum")],
]


@pytest.mark.parametrize(("make", "name"), ENVS)
def test_a_saved_env_steps_on_as_the_original_does(
    tmp_path: Path, make: Callable[[str], gym.Env], name: str
) -> None:
    """Taken mid-episode, written to a resume file, read back and put into an env that is
    elsewhere: it steps on exactly as the env it was taken from (same observations and
    rewards, episodes ending alike, random resets included)."""
    original, copy = make(name), make(name)
    original.action_space.seed(1)
    original.reset(seed=1)
    for _ in range(7):
        original.step(original.action_space.sample())
    assert unsaved_state(original) is None
    file = io.BytesIO()
    statefile.dump(env_state(original), file)
    (tmp_path / "state.npz").write_bytes(file.getvalue())
    copy.reset(seed=2)
    setattr(copy, SAVED_STATE, statefile.load(tmp_path / "state.npz"))
    restore_saved(copy)
    for _ in range(60):
        action = original.action_space.sample()
        a, b = original.step(action), copy.step(action)
        assert _same(a[:4], b[:4])
        if a[2] or a[3]:
            assert _same(original.reset(), copy.reset())


def _same(a: Any, b: Any) -> bool:
    """Equal bit for bit, NumPy arrays and scalars in them included (their pickles are
    their types, shapes and bytes; a pickle here is only compared, never read)."""
    return pickle.dumps(a) == pickle.dumps(b)


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_an_env_whose_state_cannot_be_saved_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """checkpoint_every=N and resume= are refused before anything is created (the command's
    check, in-process); auto (the default) and 0 train, with one line at start saying the
    run cannot be resumed, and leave no resume file."""
    args = [*STATEFUL, "task.id=stateful/DequeWalk-v0", "env=gym-sync"]
    monkeypatch.chdir(tmp_path)
    refusals = {
        "checkpoint_every=1000": (
            "rlspeed: invalid checkpoint_every=1000: expected 0 or auto (both off) for env "
            f"stateful/DequeWalk-v0, whose runs cannot resume: it {UNSAVED}",
            "rlspeed_get_state and rlspeed_set_state",
        ),
        "resume=some_run": (
            "rlspeed: invalid resume=some_run: expected no resume of env stateful/DequeWalk-v0: "
            f"it {UNSAVED}",
        ),
    }
    for override, fragments in refusals.items():
        line = refused_line([*args, override], capsys)
        assert all(fragment in line for fragment in fragments), line
    assert list(tmp_path.iterdir()) == []

    budget = [*DQN, "total_steps=400", "log_every=200", "eval_every=400"]
    for every in ("auto", "0"):
        run = run_cli([*args, *budget, f"checkpoint_every={every}", f"hydra.run.dir={every}"],
                      tmp_path)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        log = (tmp_path / every / "rlspeed.log").read_text()
        notes = [line for line in log.splitlines() if "cannot be resumed" in line]
        off = " (checkpoint_every=auto is off for it)" if every == "auto" else ""
        assert len(notes) == 1 and f"cannot be resumed{off}: env stateful/DequeWalk-v0" in notes[0]
        saved = yaml.safe_load((tmp_path / every / "config.yaml").read_text())
        assert saved["checkpoint_every"] == 0  # what the run did
        # No resume file: none could continue the run exactly.
        assert (tmp_path / every / "checkpoint.pt").is_file()
        assert not (tmp_path / every / "resume.npz").exists()


def _cut_after_first_log(args: list[str], cwd: Path) -> None:
    """Start the command and SIGTERM it (its gym-async workers too) at its first progress line."""
    with start_cli(args, cwd, stderr=subprocess.STDOUT, process_group=0) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if " - step " in line:
                os.killpg(proc.pid, signal.SIGTERM)
                break
        lines.append(proc.stdout.read())
        proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines)[-2000:]


# Whole processes, all slow: the default selection checks the same states in one process
# (test_a_saved_env_steps_on_as_the_original_does) and a SIGTERM resume in test_resume.py.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("walk", "engine"),
    [
        ("HookedDequeWalk", "gym-sync"),
        ("HookedDequeWalk", "gym-async"),  # the hook runs in the worker processes
        ("ListWalk", "gym-sync"),
        ("DictWalk", "gym-sync"),
    ],
)
def test_sigterm_then_resume_ends_like_an_uninterrupted_run(
    tmp_path: Path, walk: str, engine: str
) -> None:
    """Cut after its first logged row (step 252) and resumed: every row and the agent as
    the run uninterrupted (the walk's state not saved, the rows from step 500 on differed)."""
    args = [*STATEFUL, f"task.id=stateful/{walk}-v0", f"env={engine}", *DQN]
    whole = run_cli([*args, "hydra.run.dir=whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    _cut_after_first_log([*args, "hydra.run.dir=cut"], tmp_path)
    resumed = run_cli([*args, "resume=cut", "hydra.run.dir=resumed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert logged_rows(tmp_path / "cut")[-1]["step"] < 1500
    assert logged_rows(tmp_path / "whole") == logged_rows(tmp_path / "resumed")
    assert saved_agent(tmp_path / "whole") == saved_agent(tmp_path / "resumed")
