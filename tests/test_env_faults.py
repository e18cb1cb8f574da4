"""A user's env or module that fails (raises, calls sys.exit, ends its gym-async worker, or
ends or hangs its process as it is imported): one ``rlspeed:`` line naming it, where and what
it said; the run FAILED in metrics.json and MLflow; the last resume point kept and named,
and resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlspeed import statefile
from rlspeed.checkpoint import RESUME_FILE
from tests.conftest import REPO_ROOT, assert_one_line_error, run_cli
from tests.test_tracking import _only_run

FAILING = [
    "task=gym", "task.import=tests.data.failing_envs", "task.id=failing/Corridor-v0",
    "+task.kwargs.fail_at=2000", "algo=ppo", "backend=torch", "num_envs=2",
    "total_steps=20000", "checkpoint_every=1024", "progress=none",
]  # fmt: skip
# PPO's iterations are 128 steps of 2 envs: step 2,000 of each env falls in the iteration from
# env step 3,840; the last checkpoint before it, at a multiple of 1,024, is at 3,072.
SAID = {
    "raise": "RuntimeError: the simulator lost its licence",
    "exit": "it called sys.exit(0)",
    "kill": "its worker process ended (the env exited or was killed)",
}
CASES = [("gym-sync", "raise"), ("gym-async", "raise"), ("gym-sync", "exit")]
CASES += [("gym-async", "exit"), ("gym-async", "kill")]


# Fault injection in whole runs: the slow selection (README); the one-line refusals of a
# failing user module below stay in the default one.
@pytest.mark.slow
@pytest.mark.parametrize(("engine", "how"), CASES)
def test_an_env_that_fails_mid_run_is_one_line_and_loses_nothing(engine, how, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*FAILING, f"env={engine}", f"+task.kwargs.how={how}", f"tracking.uri={uri}"]
    result = run_cli([*args, "hydra.run.dir=run"], tmp_path)
    run = tmp_path / "run"
    # A gym-async worker that calls sys.exit ends as a killed one does: without a word.
    said = SAID["kill" if (engine, how) == ("gym-async", "exit") else how]
    line = (
        "rlspeed: env failing/Corridor-v0 failed in its step (in the iteration from env step "
        f"3,840): {said}; resume={run} continues from env step 3,072, its last resume point"
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [line]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "FAILED" and metrics["errors"] == [line.removeprefix("rlspeed: ")]
    assert _only_run(uri)[1].info.status == "FAILED"
    # The resume point is the last whole iteration's, not the failing one's; the env's own
    # traceback (a gym-async worker's too) is in the log file.
    assert statefile.load(run / RESUME_FILE)["step"] == 3072
    if how == "raise":
        assert (
            'raise RuntimeError("the simulator lost its licence")'
            in (run / "rlspeed.log").read_text()
        )
    # Resumed, it continues from there, and the env fails where it failed (its step count
    # is part of its saved state).
    again = run_cli([*args, f"resume={run}", "hydra.run.dir=again"], tmp_path)
    assert again.returncode == 1 and again.stderr.strip().splitlines() == [
        line.replace("env step 3,072, its last resume point", "where this run started")
    ]


@pytest.mark.slow
def test_an_env_that_hangs_on_gym_async_is_one_line(tmp_path: Path) -> None:
    """A worker that does not answer within env.step_timeout_s: its env is taken to hang,
    the run ends FAILED in one line, and no worker is left behind."""
    args = [*FAILING, "env=gym-async", "+task.kwargs.how=hang", "env.step_timeout_s=2"]
    result = run_cli([*args, "tracking=none", "hydra.run.dir=run"], tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "rlspeed: env failing/Corridor-v0 failed in its step (in the iteration from env step "
        "3,840): it did not answer (hangs?): "
    ), line
    assert "resume=" in line and "continues from env step 3,072" in line
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["status"] == "FAILED"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("import sys\nsys.exit(0)\n", "importing it ended its process with exit code 0"),
        ("import os\nos._exit(3)\n", "importing it ended its process with exit code 3"),
        ("raise ImportError('needs a licence server')\n", "ImportError: needs a licence server"),
    ],
)
def test_a_module_that_exits_as_it_is_imported_is_one_line(body, said, tmp_path: Path):
    (tmp_path / "ending_module.py").write_text(body)
    args = ["task=gym", "task.import=ending_module", "task.id=CartPole-v1", "env=gym-sync"]
    result = run_cli([*args, "tracking=none"], tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert_one_line_error(
        result,
        f"rlspeed: invalid task.import=ending_module: expected a module Python can import ({said})",
    )
    assert not (tmp_path / "outputs").exists()


def test_a_module_of_the_id_is_tried_first_too(tmp_path: Path):
    """``task.id=module:Env-v0``: Gymnasium imports the module; rlspeed tries it first."""
    (tmp_path / "ending_module.py").write_text("import os\nos._exit(3)\n")
    args = ["task=gym", "task.id=ending_module:CartPole-v1", "env=gym-sync", "tracking=none"]
    result = run_cli(args, tmp_path, env={"PYTHONPATH": f"{tmp_path}:{REPO_ROOT}"})
    assert_one_line_error(
        result,
        "rlspeed: invalid task.id=ending_module: expected a module Python can import "
        "(importing it ended its process with exit code 3)",
    )
