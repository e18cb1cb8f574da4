"""A new study's first trial is the run's own composed config (hydra.sweeper.enqueue_defaults),
and every shipped search space holds the defaults of the run it selects.

The quick tests check the enqueueing on the config tree and a real journal file in-process;
the slow ones sweep every shipped search through the real CLI at a small budget: trial 0
holds the plain command's values, and the study's best is at least what they score (one
batched sweep beside a lone default run of the same budget and seed, which its trial 0
matches).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rlspeed_optuna_sweeper._defaults import default_params, enqueue_defaults
from hydra_plugins.rlspeed_optuna_sweeper._space import SweepSetup, build
from rlspeed.bench.searches import QUICK
from rlspeed.checkpoint import read_metrics
from rlspeed.cli import CONF_DIR
from rlspeed.config_tree import register_configs
from rlspeed.sweep import open_storage, study_value
from tests.conftest import run_cli

HPARAMS = sorted(path.stem for path in (Path(CONF_DIR) / "hparams").glob("*.yaml"))
# Each shipped search swept through the CLI (slow) at its QUICK budget (rlspeed-bench
# searches --quick), two trials: 20-40 s on 2 cores, dqn_search ~1 min.
SLOW = list(QUICK)


def _composed(overrides: list[str], arguments: list[str] = ()) -> tuple[DictConfig, SweepSetup]:
    """The config a sweep's sweeper gets (hydra node and all), and its checked setup."""
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    return cfg, build(cfg.hydra.sweeper, cfg, list(arguments))


@pytest.mark.parametrize("option", HPARAMS)
def test_every_shipped_search_space_holds_the_defaults_of_the_run_it_selects(option):
    """conf/algo_task's overrides included: a default outside its range would leave the
    search unable to start from what the defaults score (dqn_search's task.max_steps was
    10-17, the task's 32)."""
    cfg, setup = _composed([f"hparams={option}"])
    params, left = default_params(cfg, setup.space)
    assert left == [], f"{option}: defaults outside the search space: {left}"
    assert set(params) == set(setup.space.distributions)


def test_a_new_studys_first_trial_is_the_defaults_and_a_resumed_one_gets_none(tmp_path):
    """Categorical, int (log and stepped) and float (log) keys alike: trial 0 takes each
    composed value; the study run again (it has trials) is not given the defaults again."""
    cfg, setup = _composed(["hparams=dqn_search"])
    storage = open_storage(str(tmp_path / "study.journal"))

    def sweep(n_trials: int) -> dict | None:
        study = optuna.create_study(
            study_name="s", storage=storage, sampler=setup.sampler, load_if_exists=True
        )
        enqueued = enqueue_defaults(study, storage, cfg, setup.space, setup.sampler)
        for _ in range(n_trials):
            study.tell(study.ask(setup.space.distributions), 0.5)
        return enqueued

    defaults = {
        "task.max_steps": 32,
        "algo.learning_rate": 0.0003,
        "algo.buffer_size": 50000,
        "algo.batch_size": 128,
        "algo.train_frequency": 4,
        "algo.optimizer": "adam",
    }
    assert sweep(2) == defaults
    assert sweep(2) is None
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.params == defaults for t in trials] == [True, False, False, False]


def test_a_default_outside_its_range_is_one_line_and_left_to_the_sampler(caplog):
    """The line names the key, its value and the range; the other keys are still enqueued.
    A grid sampler, which visits every point itself, gets no extra trial."""
    cfg, setup = _composed(["hparams=dqn_search", "task.max_steps=40"])
    study = optuna.create_study(sampler=setup.sampler)
    with caplog.at_level(logging.INFO):
        enqueued = enqueue_defaults(study, study._storage, cfg, setup.space, setup.sampler)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "task.max_steps=40 (outside [10, 32])" in warnings[0]
    assert enqueued is not None and "task.max_steps" not in enqueued
    trial = study.ask(setup.space.distributions)
    assert trial.params["algo.buffer_size"] == 50000 and 10 <= trial.params["task.max_steps"] <= 32

    grid = ["algo=qlearn", "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid"]
    cfg, setup = _composed(grid, ["algo.alpha=0.1,0.5"])
    study = optuna.create_study(sampler=setup.sampler)
    assert enqueue_defaults(study, study._storage, cfg, setup.space, setup.sampler) is None


def _sweep(
    search: str,
    tmp_path: Path,
    extra: list[str],
    make_cfg: Callable[[list[str]], DictConfig],
    n_trials: int | None = None,
) -> tuple[optuna.Study, DictConfig]:
    """``search`` swept through the real CLI at its small budget (rlspeed.bench.searches.
    QUICK; ``n_trials`` in place of its trials where given), with ``extra``: the study, whose
    first trial must hold the values the plain command of its algo and task trains with, and
    that plain command's config."""
    cfg, setup = _composed([f"hparams={search}"])
    quick_trials, total_steps, report_every = QUICK[search]
    n_trials = n_trials or quick_trials
    sweep_args = ["-m", f"hparams={search}", f"hydra.sweeper.n_trials={n_trials}"]
    sweep_args.append(f"hydra.sweeper.report_every={report_every}")
    common = [f"total_steps={total_steps}", "tracking=none", "progress=plain"]
    sweep = run_cli([*sweep_args, *common, *extra], cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    journal = tmp_path / "outputs" / "optuna" / f"{search}.journal"
    study = optuna.load_study(study_name=search, storage=open_storage(str(journal)))
    plain = make_cfg([f"algo={cfg.algo.name}", f"task={cfg.task.name}"])
    defaults = {key: OmegaConf.select(plain, key) for key in setup.space.distributions}
    assert study.trials[0].params == defaults
    return study, plain


@pytest.mark.slow
@pytest.mark.parametrize("search", SLOW)
def test_a_shipped_search_reaches_the_default_score_at_a_small_budget(search, tmp_path, make_cfg):
    """Through the CLI, the sweep's trial 0 trains the plain command's values to the end, so
    the study's best is at least what they score (the batched test below trains a lone
    default run beside its sweep, and finds trial 0 scoring what it scores). A second trial
    samples the space; how far the best goes past the defaults is the benchmark's
    (``rlspeed-bench searches``)."""
    study, _ = _sweep(search, tmp_path, [], make_cfg, n_trials=2)
    assert [trial.number for trial in study.trials] == [0, 1]
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert study.best_value >= study.trials[0].value, (study.best_value, study.trials[0])


@pytest.mark.slow
def test_a_batched_sweeps_first_lane_is_the_defaults(tmp_path, make_cfg):
    """With hydra.sweeper.batch_size the defaults are the first batch's first lane, and
    train what a lone default run of the same budget and seed trains."""
    study, plain = _sweep("qlearn_search", tmp_path, ["hydra.sweeper.batch_size=4"], make_cfg)
    _, total_steps, _ = QUICK["qlearn_search"]
    stack = [f"algo={plain.algo.name}", f"task={plain.task.name}", f"total_steps={total_steps}"]
    default = run_cli([*stack, "tracking=none", "hydra.run.dir=default"], cwd=tmp_path)
    assert default.returncode == 0, default.stderr[-3000:]
    assert study.trials[0].value == study_value(read_metrics(tmp_path / "default")["score"])
