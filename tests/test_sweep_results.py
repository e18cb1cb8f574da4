"""What a sweep leaves: multi-objective studies and their Pareto front, values rounded so
that ties tie, a readable contour plot, and plots that show inside MLflow's artifact view.

Tiny torch trials on GridWorld against a real Optuna journal file, through the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from omegaconf import OmegaConf

from hydra_plugins.rlspeed_optuna_sweeper._results import write_plots
from rlspeed.cli import CONF_DIR
from rlspeed.sweep import TrialReporter, open_storage, study_value
from tests.conftest import run_cli, script_sources

TINY = [
    "backend=torch",
    "env=gym-sync",
    "task=gridworld",
    "total_steps=2000",
    "algo.learning_starts=500",
    "algo.hidden_sizes=[16]",
    "tracking=none",
    "progress=plain",
]
# dqn_search: 6 parameters and the Hyperband pruner.
MULTI = [
    "-m",
    "hparams=dqn_search",
    "hydra.sweeper.direction=[maximize,minimize]",
    "hydra.sweeper.n_trials=3",
    "hydra.sweeper.sampler.seed=1",
    *TINY,
]
PARAMS = list(OmegaConf.load(Path(CONF_DIR) / "hparams" / "dqn_search.yaml").hydra.sweeper.params)


@pytest.mark.slow
def test_multi_objective_sweep_optimizes_named_metrics_and_plots_the_pareto_front(tmp_path):
    result = run_cli([*MULTI, "hydra.sweeper.objectives=[score,wall_time_s]"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    # dqn_search's Hyperband pruner is off, said once.
    assert output.count("No pruning: Optuna cannot prune a multi-objective study") == 1

    journal = tmp_path / "outputs" / "optuna" / "dqn_search.journal"
    study = optuna.load_study(study_name="dqn_search", storage=open_storage(str(journal)))
    assert study.metric_names == ["score", "wall_time_s"]
    trials = study.trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    raw_times = []
    for trial in trials:
        metrics = json.loads((Path(trial.user_attrs["output_dir"]) / "metrics.json").read_text())
        raw = [metrics["score"], metrics["wall_time_s"]]
        # The run's own numbers, rounded so that equal values tie exactly.
        assert trial.values == [study_value(v) for v in raw]
        raw_times.append(raw[1])
        assert f"Trial {trial.number}: COMPLETE, score {trial.values[0]:.6g}, wall_time_s" in output
    assert any(t != study_value(t) for t in raw_times), "wall times have more than 6 digits"

    (sweep_dir,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    front = sorted(t.number for t in study.best_trials)
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["objectives"] == ["score", "wall_time_s"]
    assert sorted(s["number"] for s in results["pareto_front"]) == front
    for solution in results["pareto_front"]:
        values = study.trials[solution["number"]].values
        assert solution["values"] == {"score": values[0], "wall_time_s": values[1]}
    assert "Pareto front of study 'dqn_search'" in result.stdout
    assert "wall_time_s (minimize)" in result.stdout

    plots = sweep_dir / "plots"
    names = ("param_importances", "contour", "pareto_front", "optimization_history")
    assert {p.name for p in plots.iterdir()} == {"plots.html", *(f"{n}.png" for n in names)}
    page = (plots / "plots.html").read_text()
    assert [f'<h2 id="{n}">' in page for n in names] == [True] * 4
    # The contour plot shows at most the 4 most important of the 6 parameters.
    contour = page.split('<h2 id="contour">')[1].split("<h2 ")[0]
    shown = [name for name in PARAMS if f'"{name}"' in contour]
    assert 2 <= len(shown) <= 4, shown

    # Resuming the study with other objectives would mix their values: refused.
    result = run_cli(
        [*MULTI, "hydra.sweeper.objectives=[score,env_steps_per_s]", "hydra.sweeper.n_trials=4"],
        cwd=tmp_path,
    )
    # (Like a changed direction, found when the sweep opens the study, not in pre-flight.)
    assert result.returncode != 0
    assert "objectives=[score,env_steps_per_s]: study 'dqn_search'" in result.stderr
    assert "optimizes [score,wall_time_s]" in result.stderr
    study = optuna.load_study(study_name="dqn_search", storage=open_storage(str(journal)))
    assert len(study.trials) == 3


def test_plots_are_pngs_and_one_page_that_needs_no_other_file(tmp_path):
    """MLflow shows an HTML artifact alone: the plots' page holds plotly.js itself and loads
    nothing from beside it or from the internet; each plot is a valid PNG too."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(lambda t: t.suggest_float("x", -1, 1) ** 2 + t.suggest_int("n", 1, 4), 8)
    files = write_plots(study, tmp_path / "plots")
    names = ("param_importances", "contour", "optimization_history")
    assert sorted(f.name for f in files) == sorted(["plots.html", *(f"{n}.png" for n in names)])
    for name in names:
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "plots" / "plots.html").read_text()
    assert script_sources(page) == []  # nothing loaded from beside it or the internet
    assert page.count("Plotly.newPlot(") == 3
    # plotly.js is in the page once (the library's own header comment), not once per plot.
    assert page.count("plotly.js v") == 1 and 3_000_000 < len(page) < 5_000_000


def test_reported_scores_are_rounded_so_that_ties_tie():
    study = optuna.create_study(direction="maximize")
    first, second = study.ask(), study.ask()
    TrialReporter(first, total_steps=10).report(0.1 + 0.2, step=5)
    TrialReporter(second, total_steps=10).report(0.3, step=5)
    values = [t.intermediate_values[5] for t in study.get_trials()]
    assert values == [0.3, 0.3]
    assert study_value(2 / 3) == 0.666667 and study_value(123456789.0) == 123457000.0
