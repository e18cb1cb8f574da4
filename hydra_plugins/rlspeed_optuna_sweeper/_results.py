"""The study's results: ``optimization_results.yaml``, the trials table and Optuna's plots
in the sweep folder (``write_results``, ``write_plots``), the best trials as a table in the
terminal (``show_best``), and what these are made of, which the loop and the parent run use
too: the best trials, the trial counts, a trial's objective values as the log writes them.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.rlspeed_optuna_sweeper._trials import SURPLUS_ATTR
from rlspeed import secrets

log = logging.getLogger(__name__)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
TOP_TRIALS = 5


def _objective_names(study: Any) -> list[str]:
    """The objectives' metric names; ``value`` (or ``objective <i>``) without them."""
    if study.metric_names is not None:
        return list(study.metric_names)
    if len(study.directions) == 1:
        return ["value"]
    return [f"objective {i}" for i in range(len(study.directions))]


def fmt_values(study: Any, values: Sequence[float]) -> str:
    """``name value`` per objective, e.g. ``score 0.742, wall_time_s 12.31``."""
    names = _objective_names(study)
    return ", ".join(f"{name} {value:.6g}" for name, value in zip(names, values, strict=True))


def best_trials(study: Any) -> list[Any]:
    """Up to TOP_TRIALS complete trials, best first; the Pareto front if multi-objective
    (all of it, in the order of its first objective, best first)."""
    if len(study.directions) > 1:
        first = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        return sorted(study.best_trials, key=lambda t: (t.values[0], t.number), reverse=first)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(complete, key=lambda t: t.value, reverse=maximize)[:TOP_TRIALS]


def trial_counts(study: Any) -> dict[str, int]:
    counts = {state.name: 0 for state in FINISHED}
    for trial in study.get_trials(deepcopy=False, states=FINISHED):
        if SURPLUS_ATTR not in trial.user_attrs:  # never ran
            counts[trial.state.name] += 1
    return counts


def write_results(study: Any, storage_spec: str, sweep_dir: Path) -> list[Path]:
    """``optimization_results.yaml``, the trials table and Optuna's plots in the sweep
    folder; returns the files written. A file that cannot be written (a full disk) ends the
    writing with one warning: the study and the trials' folders already hold everything."""
    files: list[Path] = []
    try:
        _write_results(study, storage_spec, sweep_dir, files)
    except OSError as error:
        warn_unwritten(error, storage_spec)
    return files


def warn_unwritten(error: OSError, storage_spec: str) -> None:
    """The one line for a file of the sweep folder that could not be written (``writing``
    names it in the error)."""
    log.warning(
        "rlspeed: could not write %s (%s); the study in %s keeps every trial, and each "
        "trial's folder its run",
        error.filename,
        error.strerror or error,
        secrets.mask(storage_spec),
    )


@contextlib.contextmanager
def writing(path: Path) -> Iterator[Path]:
    """Name ``path`` in an OSError raised while it is written: a full disk fails a write, whose
    error names no file."""
    try:
        yield path
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise


def _write_results(study: Any, storage_spec: str, sweep_dir: Path, files: list[Path]) -> None:
    """write_results, adding each file to ``files`` once it is written."""
    results: dict[str, Any] = {
        "name": "optuna",
        "study_name": study.study_name,
        "storage": secrets.mask(storage_spec),
        "directions": [d.name.lower() for d in study.directions],
        "objectives": study.metric_names,
        "trials": trial_counts(study),
    }
    best = best_trials(study)
    if len(study.directions) == 1:
        results["best_trial"] = best[0].number if best else None
        results["best_value"] = best[0].value if best else None
        results["best_params"] = dict(best[0].params) if best else None
    else:
        names = _objective_names(study)
        results["pareto_front"] = [
            {
                "number": t.number,
                "values": dict(zip(names, t.values, strict=True)),
                "params": dict(t.params),
            }
            for t in best
        ]
    with writing(sweep_dir / "optimization_results.yaml") as path:
        OmegaConf.save(OmegaConf.create(results), path)
    files.append(path)
    try:
        table = study.trials_dataframe()
    except Exception as error:  # noqa: BLE001 - results must not sink the sweep
        log.warning("No trials table: %s", error)
    else:
        with writing(sweep_dir / "trials.csv") as path:
            table.to_csv(path, index=False)
        files.append(path)
    if best:
        files += write_plots(study, sweep_dir / "plots")


# Parameters of the contour plot: its grid has one panel per pair, unreadable beyond 4.
CONTOUR_PARAMS = 4
CONTOUR_PANEL_PX = 280


def write_plots(study: Any, out_dir: Path) -> list[Path]:
    """Parameter importance, contour (of the CONTOUR_PARAMS most important parameters),
    optimization history and, for several objectives, the Pareto front: each as a PNG
    (matplotlib; plotly's static export needs a browser), and all of them, interactive, on
    one HTML page (``PLOTS_PAGE``, plotly). Plots of one objective show the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import optuna.visualization as vis
    import optuna.visualization.matplotlib as vis_mpl

    out_dir.mkdir(parents=True, exist_ok=True)
    multi = len(study.directions) > 1
    names = _objective_names(study)
    target: dict[str, Any] = {"target_name": names[0]}
    if multi:
        target["target"] = lambda t: t.values[0]
    files = []
    figures: dict[str, Any] = {}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # e.g. "unique value length < 2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        top = _top_params(study, target.get("target"))
        # The contour's grid grows with its parameters (None: all of them, few enough): the
        # parameters it shows where more than 2, else 0.
        big_contour = len(top) if top is not None and len(top) > 2 else 0
        plots = {
            "param_importances": target,
            "contour": {**target, "params": top},
            "optimization_history": target,
        }
        if multi:
            plots["pareto_front"] = {"target_names": names}
        for name, args in plots.items():
            try:
                fig = getattr(vis, f"plot_{name}")(study, **args)
                if name == "contour" and big_contour:
                    size = CONTOUR_PANEL_PX * big_contour
                    fig.update_layout(width=size + 200, height=size)
                figures[name] = fig
                axes = getattr(vis_mpl, f"plot_{name}")(study, **args)
                figure = np.atleast_1d(axes).flat[0].figure
                if name == "contour" and big_contour:
                    figure.set_size_inches(2.5 * big_contour + 1.5, 2.5 * big_contour)
                with writing(out_dir / f"{name}.png") as png:
                    figure.savefig(png, dpi=100, bbox_inches="tight")
                plt.close(figure)
                files.append(png)
            except OSError:
                raise  # the folder takes no more files: write_results says so, once
            except Exception as error:  # noqa: BLE001 - e.g. too few trials for importances
                log.warning("No %s plot: %s", name, " ".join(str(error).split()))
    optuna.logging.set_verbosity(verbosity)
    if figures:
        with writing(out_dir / PLOTS_PAGE) as page:
            files.append(_write_page(page, study.study_name, figures))
    return files


# The interactive plots, together on one page that holds plotly.js itself. MLflow shows an
# HTML artifact alone, from a blob: URL in a sandboxed frame, so a page that loads a script
# beside it (or from a CDN a cluster's browser may not reach) stays blank there. plotly.js is
# 3.6 MB: once per sweep, not once per plot (which would cost ~15 MB per sweep).
PLOTS_PAGE = "plots.html"


def _write_page(path: Path, title: str, figures: dict[str, Any]) -> Path:
    """``figures`` (name -> plotly figure) on one self-contained page, each under a heading
    whose anchor is its name, linked from the top."""
    from html import escape

    links = " | ".join(f'<a href="#{name}">{name.replace("_", " ")}</a>' for name in figures)
    sections = [
        f'<h2 id="{name}">{name.replace("_", " ")}</h2>'
        + fig.to_html(full_html=False, include_plotlyjs=index == 0)
        for index, (name, fig) in enumerate(figures.items())
    ]
    head = f'<meta charset="utf-8"><title>{escape(title)}: Optuna plots</title>'
    body = f"<h1>{escape(title)}</h1><p>{links}</p>{''.join(sections)}"
    path.write_text(f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>")
    return path


def _top_params(study: Any, target: Any) -> list[str] | None:
    """The CONTOUR_PARAMS most important parameters (all of them if their importances
    cannot be had yet, e.g. from one complete trial)."""
    try:
        importances = optuna.importance.get_param_importances(study, target=target)
    except Exception:  # noqa: BLE001 - Optuna raises several kinds for too few trials
        return None
    return list(importances)[:CONTOUR_PARAMS]


def show_best(study: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    counts = trial_counts(study)
    best = best_trials(study)
    multi = len(study.directions) > 1
    title = (
        f"{'Pareto front' if multi else 'Best trials'} of study '{study.study_name}' "
        f"({counts['COMPLETE']} complete, {counts['PRUNED']} pruned, {counts['FAIL']} failed)"
    )
    # One column per trial: parameter names are long and a terminal is narrow.
    table = Table(title=title)
    table.add_column("trial")
    for trial in best:
        table.add_column(f"#{trial.number}", justify="right")
    for i, name in enumerate(_objective_names(study)):
        directed = f"{name} ({study.directions[i].name.lower()})" if multi else name
        table.add_row(directed, *[f"{t.values[i]:.6g}" for t in best])
    for name in sorted({name for trial in best for name in trial.params}):
        table.add_row(name, *[fmt_param(t.params.get(name)) for t in best])
    Console().print(table)


def fmt_param(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
