"""The Python API (rlspeed.train, rlspeed.load): the README's example as a user runs it, the
same run as the command, the command's checks, and the saved agent acting."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlspeed
from rlspeed.errors import ConfigError, RLSpeedError
from tests.conftest import REPO_ROOT, SMALL, cli_env, logged_rows, run_cli, without_rates

README = Path(REPO_ROOT) / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## From Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the README's Python API section has one example"
    return blocks[0]


def test_the_readme_example_trains_acts_and_writes_only_its_run_folder(tmp_path: Path) -> None:
    report = "print('SCORE', result.score, 'STEPS', result.metrics['env_steps'])"
    script = readme_example() + "\n" + report + "\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reported = re.search(r"SCORE (\S+) STEPS (\d+)", done.stdout)
    assert reported is not None, done.stdout[-3000:]
    score, steps = reported.groups()
    assert int(steps) == 20_000
    folder = tmp_path / "runs" / "cartpole-dqn"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED"
    assert float(score) == pytest.approx(metrics["score"])
    # Everything the run wrote is in its folder: nothing lands in the working directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert {"config.yaml", "checkpoint.msgpack", "rlspeed.log", ".hydra"} <= {
        p.name for p in folder.iterdir()
    }


def test_train_runs_what_the_command_runs(tmp_path: Path) -> None:
    overrides = [*SMALL, "algo=dqn", "task=doors", "backend=torch", "env=gym-sync", "seed=3"]
    cli = run_cli([*overrides, "tracking=none", f"hydra.run.dir={tmp_path / 'cli'}"], tmp_path)
    assert cli.returncode == 0, cli.stderr
    # The same settings as Python values: numbers and lists parsed, names kept as they are.
    values = {
        key: json.loads(value) if value[0] in "[0123456789" else value
        for key, value in (line.split("=", 1) for line in overrides)
    }
    groups = {key: values.pop(key) for key in ("algo", "task", "backend", "env")}
    result = rlspeed.train(**groups, tracking="none", out_dir=tmp_path / "api", **values)
    assert result.out_dir == tmp_path / "api"
    assert result.metrics["status"] == "FINISHED"
    assert result.score == json.loads((tmp_path / "cli" / "metrics.json").read_text())["score"]
    api_rows = [without_rates(row) for row in result.metrics["history"]]
    assert api_rows == logged_rows(tmp_path / "cli")
    # The agent acts as its saved policy does, on one observation or a batch.
    agent = result.agent
    assert agent.seeds == [3]
    observations = np.stack([first_observation(tmp_path / "api", seed) for seed in range(4)])
    assert [agent.act(obs) for obs in observations] == list(agent.act_batch(observations))


def first_observation(folder: Path, seed: int) -> np.ndarray:
    """The first observation of an episode of the run's task, as its env gives it."""
    from rlspeed.registry import TASKS
    from rlspeed.saved_config import read_config

    saved = read_config("checkpoint", str(folder), folder)
    env = TASKS.get(saved.task.name).make_env(saved.task)
    observation, _ = env.reset(seed=seed)
    env.close()
    return np.asarray(observation)


def test_bad_values_raise_the_command_line_before_anything_is_created(tmp_path: Path) -> None:
    out_dir = tmp_path / "never"
    with pytest.raises(ConfigError, match=r"^rlspeed: invalid algo.learning_rate=-1.0: expected"):
        rlspeed.train(algo="dqn", out_dir=out_dir, **{"algo.learning_rate": -1})
    with pytest.raises(RLSpeedError, match=r"^rlspeed: invalid algo=nope: expected one of dqn"):
        rlspeed.train(algo="nope", out_dir=out_dir)
    assert not out_dir.exists()
    with pytest.raises(ConfigError, match=r"invalid folder=.*: expected a run folder holding"):
        rlspeed.load(tmp_path)


def test_a_run_is_checked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check before anything is created is the run's: the job does not check (nor read
    the folders its config names) a second time."""
    from rlspeed import run_folders

    checked = []
    check_modes = run_folders.check_modes
    monkeypatch.setattr(
        run_folders, "check_modes", lambda cfg: checked.append(cfg) or check_modes(cfg)
    )
    overrides = {"total_steps": 200, "log_every": 100, "eval_every": 200, "num_envs": 2}
    result = rlspeed.train(
        algo="qlearn", task="gridworld", backend="torch", env="gym-sync", tracking="none",
        out_dir=tmp_path / "run", **overrides,
    )  # fmt: skip
    assert result.metrics["status"] == "FINISHED"
    assert len(checked) == 1
