"""Optuna sweeps through the real CLI: pruning, resuming, parallel trials, MLflow, bad input.

Every sweep runs tiny torch trials on a 7x7 Doors (a few seconds each) against a real
Optuna journal file and a real MLflow SQLite store in the test's folder.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.rlspeed_optuna_sweeper._seeding import TrialSeededSampler
from hydra_plugins.rlspeed_optuna_sweeper._space import build
from hydra_plugins.rlspeed_optuna_sweeper._sweep import progress_line
from rlspeed.cli import CONF_DIR
from rlspeed.sweep import open_storage
from rlspeed.validation import check
from tests.conftest import run_cli, script_sources, start_cli, wait_for_log

# Tiny trials: torch on 4 synchronous envs, 3000 env steps, a report every 1000 steps.
TINY = [
    "backend=torch",
    "env=gym-sync",
    "num_envs=4",
    "task.grid_size=7",
    "total_steps=3000",
    "log_every=1000",
    "algo.learning_starts=500",
    "algo.hidden_sizes=[32]",
    "progress=plain",
]
# The seed's search, made small; the median pruner prunes any trial below the median of
# the finished ones after the first, and the seeded sampler makes the outcome repeatable.
SEARCH = [
    "-m",
    "hparams=dqn_search",
    "hydra/sweeper=optuna",
    "hydra.sweeper.report_every=1000",
    "hydra.sweeper.sampler.seed=1",
    "hydra/sweeper/pruner=median",
    "hydra.sweeper.pruner.n_startup_trials=1",
    *TINY,
]
PLOTS = {
    "plots/plots.html",
    *(f"plots/{name}.png" for name in ("param_importances", "contour", "optimization_history")),
}


def _study(path, name="dqn_search"):
    return optuna.load_study(study_name=name, storage=open_storage(str(path)))


def _states(study) -> list[str]:
    return [t.state.name for t in study.trials]


def _runs(uri: str):
    """(client, parent runs, child runs by trial number) of the store at ``uri``."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rlspeed")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    numbers = [int(r.data.tags["optuna.trial"]) for r in children]
    assert len(numbers) == len(set(numbers)), f"duplicated child runs: {sorted(numbers)}"
    return client, parents, {int(r.data.tags["optuna.trial"]): r for r in children}


def _log_span(job_dir: Path) -> tuple[datetime.datetime, datetime.datetime]:
    """When a job's rlspeed.log has its first and its last timestamped line."""
    stamps = [
        datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
        for line in (job_dir / "rlspeed.log").read_text().splitlines()
        if line.startswith("[")
    ]
    return stamps[0], stamps[-1]


def _sweep_dirs(tmp_path):
    return sorted(p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir())


@pytest.mark.slow  # 20-30 s: a whole sweep with its pruner
def test_study_prunes_tracks_in_mlflow_and_resumes(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*SEARCH, f"tracking.uri={uri}"]
    result = run_cli([*args, "hydra.sweeper.n_trials=4"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    journal = tmp_path / "outputs" / "optuna" / "dqn_search.journal"
    study = _study(journal)
    states = _states(study)
    assert len(states) == 4 and "COMPLETE" in states and "PRUNED" in states, states
    # The study names its objective, and the console follows the sweep between trials.
    assert study.metric_names == ["score"]
    console = result.stdout + result.stderr
    progress = [line for line in console.splitlines() if "] Sweep: " in line]
    assert len(progress) == 4 and "Sweep: 4/4 trials ended" in progress[-1], progress
    for trial in study.trials:
        assert set(trial.params) == {
            "task.max_steps",
            "algo.learning_rate",
            "algo.buffer_size",
            "algo.batch_size",
            "algo.train_frequency",
            "algo.optimizer",
        }
        assert 10 <= trial.params["task.max_steps"] <= 32
        assert trial.params["algo.batch_size"] in range(16, 129, 16)
        assert trial.params["algo.optimizer"] in ("adam", "sgd")
        assert min(trial.intermediate_values) == 1000  # reported every report_every steps
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert all(max(t.intermediate_values) < 3000 for t in pruned), "pruned trials stop early"

    # MLflow: one parent run for the study, one nested child per trial.
    client, parents, children = _runs(uri)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.run_name == "dqn_search" and parent.info.status == "FINISHED"
    assert parent.data.tags["optuna.study"] == "dqn_search"
    # The parent and each child name what they ran on (rlspeed.tracking._environment).
    assert "hparams=dqn_search" in parent.data.tags["rlspeed.command"]
    assert all("rlspeed.version.optuna" in c.data.tags for c in children.values())
    assert sorted(children) == [0, 1, 2, 3]
    for trial in study.trials:
        child = children[trial.number]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert "eval/score" in child.data.metrics
        assert child.data.params["algo.optimizer"] == trial.params["algo.optimizer"]
        if trial.state == TrialState.PRUNED:
            assert child.info.status == "KILLED"
            assert child.data.tags["optuna.pruned"] == "true"
            # No sweep continues a pruned trial: its replay buffer is not kept.
            folder = Path(trial.user_attrs["output_dir"])
            assert (folder / "checkpoint.pt").is_file() and not (folder / "resume.npz").exists()
        else:
            assert child.info.status == "FINISHED"
    best = study.best_trial
    assert parent.data.metrics["best_value"] == pytest.approx(best.value)
    assert parent.data.params["best.algo.optimizer"] == best.params["algo.optimizer"]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    artifacts |= {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"optimization_results.yaml", "trials.csv", *PLOTS} <= artifacts
    # The plots' page as MLflow serves it needs no other file (MLflow shows it alone).
    page = client.download_artifacts(parent.info.run_id, "plots/plots.html", str(tmp_path))
    assert script_sources(Path(page).read_text()) == []

    # The sweep folder: results file and the table of the best trials.
    (sweep_dir,) = _sweep_dirs(tmp_path)
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["study_name"] == "dqn_search" and results["storage"] == str(journal)
    assert results["best_value"] == pytest.approx(best.value)
    assert results["best_params"] == best.params
    assert "Best trials of study 'dqn_search'" in result.stdout
    # The console: one line per trial with its state, value and sampled values; no run's
    # progress or summary, no job overrides with internal keys; the sweep's folder and
    # parent run at the end.
    console = result.stdout + result.stderr
    for trial in study.trials:
        (line,) = [x for x in console.splitlines() if f"Trial {trial.number}: " in x]
        assert f"Trial {trial.number}: {trial.state.name}" in line
        assert f"algo.optimizer={trial.params['algo.optimizer']}" in line
    for internal in ("trial.storage=", "Launching", "rlspeed run", "steps/s"):
        assert internal not in console
    where, ui, page = console.rstrip().splitlines()[-3:]
    assert where.endswith(
        f"rlspeed: sweep folder {sweep_dir.resolve()}; study in {journal}; "
        f"MLflow parent run {parent.info.run_id}"
    )
    assert ui.endswith(f"MLflow UI: mlflow ui --backend-store-uri {uri}")
    assert page.endswith(
        f"/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}"
        "?workflowType=machine_learning (with mlflow ui)"
    )

    # The same command with a larger budget resumes the study: earlier trials are kept.
    first = [(t.number, t.state, t.params) for t in study.trials]
    result = run_cli([*args, "hydra.sweeper.n_trials=6"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    study = _study(journal)
    assert len(study.trials) == 6
    assert [(t.number, t.state, t.params) for t in study.trials[:4]] == first
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    _, parents, children = _runs(uri)
    assert len(parents) == 1 and sorted(children) == list(range(6))
    assert {c.data.tags["mlflow.parentRunId"] for c in children.values()} == {
        parents[0].info.run_id
    }


@pytest.mark.slow
def test_parallel_trials_with_joblib_are_neither_lost_nor_duplicated(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [
        *SEARCH,
        # hydra.sweeper.n_jobs left unset: the sweep asks for as many trials as the
        # launcher runs at once (SPEC §1's joblib line).
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "hydra.sweeper.n_trials=4",
        f"tracking.uri={uri}",
    ]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    study = _study(tmp_path / "outputs" / "optuna" / "dqn_search.journal")
    assert [t.number for t in study.trials] == [0, 1, 2, 3]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    _, parents, children = _runs(uri)
    assert len(parents) == 1 and sorted(children) == [0, 1, 2, 3]
    (sweep_dir,) = _sweep_dirs(tmp_path)
    # Two at a time: the first two trials trained at the same time (their logs' spans
    # overlap; MLflow's start times are when each run's writer reached the store).
    first, second = (_log_span(sweep_dir / f"{n}_torch_gym-sync_dqn_doors") for n in (0, 1))
    assert first[0] < second[1] and second[0] < first[1], (first, second)
    jobs = sorted(p.name for p in sweep_dir.glob("*_dqn_doors"))
    assert jobs == [f"{n}_torch_gym-sync_dqn_doors" for n in range(4)]


# (sweep, its study) one trial at a time and as lanes of one program (hydra.sweeper.batch_size)
RESULTS_SWEEPS = {
    "one at a time": (SEARCH, "dqn_search"),
    "batched": (
        ["-m", "hparams=qlearn_search", "backend=flax", "env=jax-vmap", "progress=none",
         "total_steps=16000", "hydra.sweeper.report_every=8000", "hydra.sweeper.batch_size=2"],
        "qlearn_search",
    ),
}  # fmt: skip


@pytest.mark.slow  # fault injection in a whole sweep
@pytest.mark.parametrize("sweep", list(RESULTS_SWEEPS))
def test_results_the_sweep_folder_cannot_take_are_one_line_and_lose_nothing(tmp_path, sweep):
    """The sweep folder takes no more files when the sweep writes its results (a full disk;
    here plots/ is a file, so no plot can be written): one line names the file and the error,
    the sweep ends as it would have, and the study, each trial's run and the MLflow parent run
    (FINISHED, with the results written before) keep everything."""
    args, name = RESULTS_SWEEPS[sweep]
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "plots").write_text("a file where the plots' folder goes")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*args, "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep_dir}"]
    result = run_cli([*args, f"tracking.uri={uri}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    console = result.stdout + result.stderr
    journal = tmp_path / "outputs" / "optuna" / f"{name}.journal"
    assert "Traceback" not in console
    (line,) = [line for line in console.splitlines() if "could not write" in line]
    assert line.endswith(
        f"rlspeed: could not write {sweep_dir / 'plots'} (File exists); the study in {journal} "
        "keeps every trial, and each trial's folder its run"
    )
    study = _study(journal, name)
    assert _states(study) in (["COMPLETE", "COMPLETE"], ["COMPLETE", "PRUNED"])
    for trial in study.trials:
        assert (Path(trial.user_attrs["output_dir"]) / "metrics.json").is_file()
    client, parents, children = _runs(uri)
    (parent,) = parents
    assert parent.info.status == "FINISHED" and sorted(children) == [0, 1]
    artifacts = {artifact.path for artifact in client.list_artifacts(parent.info.run_id)}
    assert {"optimization_results.yaml", "trials.csv"} <= artifacts


@pytest.mark.slow
def test_config_written_for_hydra_optuna_sweeper_runs_unchanged(tmp_path):
    """The documented example's keys and params syntax, as an hparams option of one's own."""
    conf = tmp_path / "conf" / "hparams"
    conf.mkdir(parents=True)
    (conf / "example.yaml").write_text(
        textwrap.dedent(
            """\
            # @package _global_
            defaults:
              - override /hydra/sweeper: optuna

            hydra:
              sweeper:
                sampler:
                  seed: 123
                direction: maximize
                study_name: doors_example
                storage: null
                n_trials: 3
                n_jobs: 1
                max_failure_rate: 0.0
                search_space: null
                custom_search_space: null
                params:
                  algo.learning_rate: tag(log, interval(1e-4, 1e-2))
                  algo.gamma: interval(0.8, 0.95)
                  algo.batch_size: choice(16, 32)
                  task.max_steps: range(10, 18, step=2)
            """
        )
    )
    args = ["-m", "--config-dir", str(tmp_path / "conf"), "hparams=example", "tracking=none"]
    result = run_cli([*args, *TINY], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    study = _study(tmp_path / "outputs" / "optuna" / "doors_example.journal", "doors_example")
    assert _states(study) == ["COMPLETE"] * 3
    for trial in study.trials:
        assert 1e-4 <= trial.params["algo.learning_rate"] <= 1e-2
        assert 0.8 <= trial.params["algo.gamma"] <= 0.95
        assert trial.params["algo.batch_size"] in (16, 32)
        assert trial.params["task.max_steps"] in (10, 12, 14, 16)  # range() excludes its stop


@pytest.mark.slow
def test_failed_trials_within_max_failure_rate(tmp_path):
    """A trial whose run fails FAILs; the sweep goes on within max_failure_rate and stops
    with one line beyond it."""
    conf = tmp_path / "conf" / "hparams"
    conf.mkdir(parents=True)
    # A learning rate of 1e30 makes the TD loss NaN by the first log: that trial's run stops.
    # (Values a key cannot take are refused before the sweep starts, in one line.)
    (conf / "failing.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /hydra/sweeper: optuna\n"
        "  - override /hydra/sweeper/sampler: grid\n"
        "hydra:\n  sweeper:\n    n_trials: 2\n    params:\n"
        "      algo.learning_rate: choice(0.001, 1e30)\n"
    )
    args = ["-m", "--config-dir", str(tmp_path / "conf"), "hparams=failing", "tracking=none"]
    args += TINY
    result = run_cli([*args, "hydra.sweeper.max_failure_rate=1.0"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    study = _study(tmp_path / "outputs" / "optuna" / "failing.journal", "failing")
    assert sorted(_states(study)) == ["COMPLETE", "FAIL"]

    result = run_cli(
        [*args, "hydra.sweeper.study_name=strict", "hydra.sweeper.max_failure_rate=0"],
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "sweep stopped: 1 of" in result.stderr and "max_failure_rate=0" in result.stderr
    assert (
        _states(_study(tmp_path / "outputs" / "optuna" / "strict.journal", "strict")).count("FAIL")
        == 1
    )


@pytest.mark.slow
def test_killed_sweep_resumes_and_records_the_interrupted_trial_as_fail(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [
        "-m",
        "hparams=dqn_search",
        "hydra.sweeper.n_trials=3",
        "hydra/sweeper/pruner=none",
        f"tracking.uri={uri}",
        *TINY,
    ]
    process = start_cli(args, tmp_path, stderr=subprocess.STDOUT, start_new_session=True)
    # Killed in the middle of the second trial (its progress is in its own log file).
    wait_for_log(process, tmp_path, "outputs/multirun/*/*/1_*/rlspeed.log", "step 1,000/")
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    journal = tmp_path / "outputs" / "optuna" / "dqn_search.journal"
    assert _states(_study(journal)) == ["COMPLETE", "RUNNING"]

    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _states(_study(journal)) == ["COMPLETE", "FAIL", "COMPLETE"]
    _, parents, children = _runs(uri)
    assert len(parents) == 1 and sorted(children) == [0, 1, 2]
    statuses = [children[n].info.status for n in (0, 1, 2)]
    # The killed trial's run: ended KILLED by its writer, which outlives the sweep, or (a
    # writer that died too) FAILED by the rerun, which ends its trial's runs left RUNNING.
    assert statuses[0] == statuses[2] == "FINISHED" and statuses[1] in ("KILLED", "FAILED")


HPARAMS = sorted(path.stem for path in (Path(CONF_DIR) / "hparams").glob("*.yaml"))


@pytest.mark.parametrize("option", HPARAMS)
def test_every_shipped_search_space_names_keys_of_the_run_it_selects(option, make_cfg):
    """A search space whose keys drifted from the configs would fail only at sweep time."""
    cfg = make_cfg([f"hparams={option}"])
    assert cfg.algo.name == option.split("_")[0]  # <algo>[_variant]_search
    check(cfg)
    space = OmegaConf.load(Path(CONF_DIR) / "hparams" / f"{option}.yaml").hydra.sweeper.params
    for key in space:
        assert OmegaConf.select(cfg, key) is not None, f"{option}: {key} is not a config key"


def test_trials_compose_alike_when_they_differ_only_in_numbers_inside_their_ranges():
    """A sweep composes one trial per composition_signature before launching it (Hydra's
    composition, ~0.2 s): trials that differ only in where a number falls inside its range
    share it; another choice, another kind of number or another key does not."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    from hydra_plugins.rlspeed_optuna_sweeper._space import composition_signature

    space = {
        "algo.gamma": FloatDistribution(0.8, 0.99),
        "algo.buffer_size": IntDistribution(1000, 5000),
        "algo/optimizer": CategoricalDistribution(["adam", "sgd"]),
    }
    first = composition_signature(
        space, {"algo.gamma": 0.9, "algo.buffer_size": 1000, "algo/optimizer": "adam"}
    )
    alike = composition_signature(
        space, {"algo/optimizer": "adam", "algo.gamma": 0.81, "algo.buffer_size": 4321}
    )
    assert alike == first
    other_choice = {"algo.gamma": 0.9, "algo.buffer_size": 1000, "algo/optimizer": "sgd"}
    assert composition_signature(space, other_choice) != first
    as_float = {**space, "algo.buffer_size": FloatDistribution(1000, 5000)}
    params = {"algo.gamma": 0.9, "algo.buffer_size": 1000.0, "algo/optimizer": "adam"}
    assert composition_signature(as_float, params) != first
    fewer = {key: space[key] for key in ("algo.gamma", "algo/optimizer")}
    assert composition_signature(fewer, {"algo.gamma": 0.9, "algo/optimizer": "adam"}) != first


def test_a_seeded_sampler_samples_each_trial_from_its_own_seed(make_cfg):
    """Each trial's draw depends on the seed and its number only: a study resumed by a
    second sweep samples what one sweep would have, and no trial repeats another's."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=["hparams=dqn_search"], return_hydra_config=True)
    setup = build(cfg.hydra.sweeper, cfg, [])  # seed 0 unless set
    assert setup.sampler_for is not None

    def sweep(storage: optuna.storages.BaseStorage, n_trials: int) -> None:
        sampler = TrialSeededSampler(setup.sampler, setup.sampler_for)
        study = optuna.create_study(
            storage=storage, sampler=sampler, study_name="s", load_if_exists=True
        )
        for _ in range(n_trials):
            study.tell(study.ask(setup.space.distributions), 0.5)

    once, resumed = optuna.storages.InMemoryStorage(), optuna.storages.InMemoryStorage()
    sweep(once, 4)
    sweep(resumed, 2)
    sweep(resumed, 2)
    params = [[t.params for t in storage.get_all_trials(0)] for storage in (once, resumed)]
    assert params[0] == params[1]
    assert len({tuple(sorted(p.items())) for p in params[0]}) == 4


def test_the_sweeps_progress_line_counts_trials_best_and_time_left():
    study = optuna.create_study(direction="maximize")
    for value in (0.2, 0.7):
        study.add_trial(optuna.trial.create_trial(value=value))
    study.add_trial(optuna.trial.create_trial(state=TrialState.PRUNED))
    # 3 trials in 90 s: 30 s each for the 7 left of n_trials=10.
    line = progress_line(study, n_trials=10, ran=3, elapsed=90.0)
    assert line == (
        "Sweep: 3/10 trials ended (2 complete, 1 pruned), best 0.7 (trial 1), 0:01:30 "
        "elapsed, ETA 0:03:30"
    )
