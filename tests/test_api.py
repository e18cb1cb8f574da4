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


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_the_readme_example_trains_acts_and_writes_only_its_run_folder(tmp_path: Path) -> None:
    report = (
        "print('SCORE', result.score, 'STEPS', result.metrics['env_steps'], 'ROWS',"
        " [int(row['step']) for row in result.metrics['history']])"
    )
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
    reported = re.search(r"SCORE (\S+) STEPS (\d+) ROWS (.*)", done.stdout)
    assert reported is not None, done.stdout[-3000:]
    score, steps, rows = reported.groups()
    assert int(steps) == 20_000
    # CartPole's DQN logs every 25,000 steps; a run of 20,000 still draws a curve.
    # (chunks of whole iterations: 1,008 env steps at a time).
    assert len(json.loads(rows)) >= 20
    folder = tmp_path / "runs" / "cartpole-dqn"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED"
    assert float(score) == pytest.approx(metrics["score"])
    # Everything the run wrote is in its folder: nothing lands in the working directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert {"config.yaml", "checkpoint.msgpack", "rlspeed.log", ".hydra"} <= {
        p.name for p in folder.iterdir()
    }


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
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
    assert result.output_dir == tmp_path / "api"
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


def test_a_folder_a_run_wrote_is_refused_unless_overwritten(tmp_path: Path) -> None:
    """A second ``train`` into the same out_dir is one line (two runs' files would mix);
    overwrite=True replaces the run; a folder of other files is never emptied."""
    run = {"algo": "qlearn", "task": "gridworld", "tracking": "none", "total_steps": 2000}
    folder = tmp_path / "run"
    first = rlspeed.train(out_dir=folder, seed=1, **run)
    assert rlspeed.load(first.output_dir).config.seed == 1
    with pytest.raises(ConfigError, match=r"invalid out_dir=.*: expected a folder no run"):
        rlspeed.train(out_dir=folder, seed=2, **run)
    assert rlspeed.load(folder).config.seed == 1  # untouched
    second = rlspeed.train(out_dir=folder, seed=2, overwrite=True, **run)
    assert second.output_dir == folder and rlspeed.load(folder).config.seed == 2
    assert second.metrics["status"] == "FINISHED"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match=r"expected a new or empty folder, or a run folder"):
        rlspeed.train(out_dir=mine, overwrite=True, **run)
    assert (mine / "notes.txt").read_text() == "keep"


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_runs_from_python_track_beside_their_folders(tmp_path, monkeypatch) -> None:
    """Default tracking from Python: an MLflow store in outputs/ (its runs' files too), not
    in the notebook's folder; beside out_dir's folder when one is given."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = {"algo": "qlearn", "task": "gridworld", "total_steps": 2000, "progress": "none"}
    result = rlspeed.train(**run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]
    store = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (tracked,) = store.search_runs([store.get_experiment_by_name("rlspeed").experiment_id])
    assert tracked.info.run_name == "flax-jax-vmap-qlearn-gridworld"
    assert tracked.info.artifact_uri.startswith(str(tmp_path / "outputs" / "mlruns"))
    assert result.metrics["status"] == "FINISHED"
    rlspeed.train(**run, out_dir=tmp_path / "runs" / "a")
    assert (tmp_path / "runs" / "mlflow.db").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs", "runs"]


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
