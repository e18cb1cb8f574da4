"""Batched trials (``hydra.sweeper.batch_size``) through the real CLI: a sweep's fused trials
train as lanes of one program, and each lane learns what a lone run of its trial learns;
the pruner stops lanes while their batch-mates train on; each trial keeps its own records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.rlspeed_optuna_sweeper._batch import _derived
from rlspeed.cli import CONF_DIR
from rlspeed.config_tree import register_configs
from rlspeed.sweep import open_storage
from tests.conftest import run_cli, start_cli, without_rates

QLEARN = [
    "hparams=qlearn_search", "backend=flax", "env=jax-vmap", "progress=none",
    "total_steps=96000", "hydra.sweeper.report_every=16000", "hydra.sweeper.sampler.seed=1",
]  # fmt: skip
# Four of PPO's batches (8 envs x 32 steps, 20 epochs each), logged after each: a lane and
# its lone run part by float rounding (vmap orders the arithmetic otherwise), which PPO's
# sampled actions amplify into other episodes within a few thousand steps (seen by 4,096 steps
# for 3 of 3 trials of seed 1; equal to ~1e-7 over these four batches).
PPO = [
    "hparams=ppo_float_search", "backend=flax", "env=jax-vmap", "progress=none",
    "total_steps=1024", "hydra.sweeper.report_every=256", "hydra.sweeper.sampler.seed=1",
]  # fmt: skip


def _trial_dirs(tmp_path: Path) -> dict[int, Path]:
    """Each trial's folder, by trial number."""
    dirs = {}
    for folder in (tmp_path / "outputs" / "multirun").glob("*/*/*/.hydra/.."):
        overrides = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text())
        number = next(int(o.split("=")[1]) for o in overrides if o.startswith("trial.number="))
        dirs[number] = folder
    return dirs


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


@pytest.mark.parametrize(
    "search",
    [
        # 20-30 s each: a batched sweep and a lone run, both through the CLI
        pytest.param(QLEARN, id="qlearn", marks=pytest.mark.slow),
        pytest.param(PPO, id="ppo", marks=pytest.mark.slow),
    ],
)
def test_each_lane_learns_what_a_lone_run_of_its_trial_learns(tmp_path, search):
    result = run_cli(
        ["-m", *search, "tracking=none", "hydra.sweeper.n_trials=3", "hydra.sweeper.batch_size=3",
         "hydra/sweeper/pruner=none"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "one program of 3 lane(s)" in result.stdout + result.stderr
    trials = _trial_dirs(tmp_path)
    assert sorted(trials) == [0, 1, 2]
    # Trial 1 alone: the same command's config with its overrides, no study.
    overrides = yaml.safe_load((trials[1] / ".hydra" / "overrides.yaml").read_text())
    config = yaml.safe_load((trials[1] / ".hydra" / "config.yaml").read_text())
    # The search's algo and task, without the search (a search runs only with -m).
    stack = [f"algo={config['algo']['name']}", f"task={config['task']['name']}"]
    alone = stack + [o for o in overrides if not o.startswith(("trial.", "hparams="))]
    lone_dir = tmp_path / "alone"
    result = run_cli([*alone, "tracking=none", f"hydra.run.dir={lone_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lane, lone = _metrics(trials[1]), _metrics(lone_dir)
    assert lane["status"] == lone["status"] == "FINISHED"
    assert lane["env_steps"] == lone["env_steps"] and len(lane["history"]) == len(lone["history"])
    for lane_row, lone_row in zip(lane["history"], lone["history"], strict=True):
        lone_row = without_rates(lone_row)
        assert without_rates(lane_row) == pytest.approx(lone_row, rel=1e-4, abs=1e-6)
    assert lane["score"] == pytest.approx(lone["score"], rel=1e-4, abs=1e-6)
    # The other lanes learned with their own values.
    finals = {json.dumps(without_rates(_metrics(trials[t])["final"])) for t in trials}
    assert len(finals) == 3


@pytest.mark.slow  # 20-30 s: a whole sweep with its pruner
def test_the_pruner_stops_lanes_while_their_batch_trains_on(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_cli(
        ["-m", *QLEARN, f"tracking.uri={uri}", "hydra.sweeper.n_trials=8",
         "hydra.sweeper.batch_size=4", "hydra.sweeper.pruner.n_startup_trials=1"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    journal = tmp_path / "outputs" / "optuna" / "qlearn_search.journal"
    study = optuna.load_study(study_name="qlearn_search", storage=open_storage(str(journal)))
    states = {t.number: t.state for t in study.trials}
    pruned = [n for n, s in states.items() if s == TrialState.PRUNED]
    assert len(states) == 8 and pruned, states
    trials = _trial_dirs(tmp_path)
    assert sorted(trials) == list(range(8))
    for trial in study.trials:
        metrics = _metrics(trials[trial.number])
        steps = max(trial.intermediate_values)
        assert (trials[trial.number] / "checkpoint.msgpack").is_file()
        if trial.state == TrialState.PRUNED:
            # Stopped at its report, its records kept; its batch-mates went on.
            assert metrics["status"] == "KILLED" and metrics["env_steps"] < 96000
            assert metrics["history"][-1]["eval/score"] == pytest.approx(
                trial.intermediate_values[steps], rel=1e-5
            )
        else:
            assert trial.state == TrialState.COMPLETE
            assert metrics["status"] == "FINISHED" and metrics["env_steps"] == 96000
            assert trial.value == pytest.approx(metrics["score"], rel=1e-5)
    # One MLflow child run per trial, KILLED where pruned.
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rlspeed")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    children = {
        int(r.data.tags["optuna.trial"]): r for r in runs if "mlflow.parentRunId" in r.data.tags
    }
    assert sorted(children) == list(range(8))
    for number, run in children.items():
        expected = "KILLED" if number in pruned else "FINISHED"
        assert run.info.status == expected and "eval/score" in run.data.metrics


@pytest.mark.slow
def test_a_killed_batched_sweep_rerun_keeps_every_completed_trial_and_repeats_none(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [
        "-m", *QLEARN, f"tracking.uri={uri}", "hydra.sweeper.batch_size=2",
        "hydra/sweeper/pruner=none", "total_steps=3000000", "log_every=100000",
    ]  # fmt: skip
    process = start_cli(
        [*args, "hydra.sweeper.n_trials=4"], tmp_path, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    for line in process.stdout:  # kill it while the second batch trains
        if "Trial(s) 2, 3: one program" in line or time.monotonic() > deadline:
            break
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    journal = tmp_path / "outputs" / "optuna" / "qlearn_search.journal"
    study = optuna.load_study(study_name="qlearn_search", storage=open_storage(str(journal)))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "RUNNING", "RUNNING"]
    kept = [(t.number, t.params, t.value) for t in study.trials[:2]]

    result = run_cli([*args, "hydra.sweeper.n_trials=6"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="qlearn_search", storage=open_storage(str(journal)))
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    assert [(t.number, t.params, t.value) for t in study.trials[:2]] == kept
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rlspeed")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    numbers = [int(r.data.tags["optuna.trial"]) for r in runs if "optuna.trial" in r.data.tags]
    assert sorted(numbers) == list(range(6))  # one child run each, none twice


@pytest.mark.parametrize(
    ("second", "derivable"),
    [
        (["algo.alpha=0.25", "algo.gamma=0.95", "trial.number=7"], True),
        (["algo.alpha=0.25", "algo=dqn", "trial.number=7"], False),  # a config group
        (["algo.alpha=0.25", "+algo.extra=1", "trial.number=7"], False),  # an added key
    ],
)
def test_a_trial_config_derived_from_its_batch_mate_is_the_config_hydra_composes(second, derivable):
    first = ["algo.alpha=0.5", "algo.gamma=0.9", "trial.number=6"]
    base = ["algo=qlearn", "task=doors", "tracking=none"]
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        composed = [
            compose("config", overrides=[*base, *o], return_hydra_config=True)
            for o in (first, second[:1] + ["algo.gamma=0.95", "trial.number=7"])
        ]
    derived = _derived([*base, *first], composed[0], [*base, *second])
    if not derivable:
        assert derived is None
        return
    assert OmegaConf.to_container(derived) == OmegaConf.to_container(composed[1])
