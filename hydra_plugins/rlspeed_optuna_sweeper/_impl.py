"""The Optuna sweeper: a persistent study, trials launched in batches, pruning, MLflow.

Every batch asks the study for ``n_jobs`` trials, launches them as one batch of Hydra jobs
(in parallel processes with ``hydra/launcher=joblib``) and tells the study how each ended:
COMPLETE with the job's return value, PRUNED when the job raised ``optuna.TrialPruned``
(the job side is :mod:`rlspeed.sweep`), FAIL otherwise. Finished trials of earlier sweeps
of the same study count toward ``n_trials``, so running the same command again resumes;
so do the live trials of sweeps of the study running at the same time (see ``_trials``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from hydra_plugins.rlspeed_optuna_sweeper._space import SweepConfigError, SweepSetup, build, quote
from hydra_plugins.rlspeed_optuna_sweeper._submitit import is_submitit, launch_each
from hydra_plugins.rlspeed_optuna_sweeper._trials import (
    SURPLUS_ATTR,
    TrialKeeper,
    counted,
    is_surplus,
)
from rlspeed import secrets
from rlspeed.errors import RLSpeedError
from rlspeed.sweep import (
    PRUNER_ATTR,
    SWEEP_PID_VARIABLE,
    check_storage,
    database_lock,
    normalize_storage,
    open_storage,
    storage_engine,
    study_value,
)

log = logging.getLogger(__name__)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# Study system attribute: the MLflow parent run of the study, per tracking store.
PARENT_ATTR = "rlspeed:mlflow_parent"
TOP_TRIALS = 5


def default_study_name(config: DictConfig) -> str:
    """The selected ``hparams`` option, else ``<algo>_<task>``, else ``<job name>``."""
    choices = OmegaConf.select(config, "hydra.runtime.choices", default={}) or {}
    if choices.get("hparams"):
        return str(choices["hparams"])
    algo = OmegaConf.select(config, "algo.name", default=None)
    task = OmegaConf.select(config, "task.name", default=None)
    if algo and task:
        return f"{algo}_{task}"
    return str(OmegaConf.select(config, "hydra.job.name", default="study"))


def default_storage(study_name: str) -> str:
    """A journal file at a stable place under the working directory (sweep folders are
    timestamped), so the same command finds the same study."""
    return str(Path.cwd() / "outputs" / "optuna" / f"{study_name}.journal")


def sweep_storage(config: DictConfig) -> str:
    """The study's storage (``hydra.sweeper.storage`` or the default), as every process
    opens it (normalize_storage); raises ConfigError if trials cannot be recorded there."""
    node = config.hydra.sweeper
    spec = node.storage or default_storage(node.study_name or default_study_name(config))
    check_storage(spec)
    return normalize_storage(spec)


class OptunaSweeperImpl:
    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.hydra_context: HydraContext | None = None
        # Trial number -> why its run's records did not all reach the tracking store.
        self.unsent: dict[int, str] = {}

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # --- the sweep --------------------------------------------------------------------

    def sweep(self, arguments: list[str], legal: Any) -> list[Sequence[JobReturn]]:
        """``legal(overrides)`` raises if a job's overrides cannot be composed."""
        assert self.config is not None and self.launcher is not None
        secrets.install()  # the storage URL and the jobs' overrides are logged
        config = self.config
        node = config.hydra.sweeper
        setup = build(node, config, list(arguments))
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # this sweeper logs what matters
        study_name = node.study_name or default_study_name(config)
        storage_spec = sweep_storage(config)
        storage = open_storage(storage_spec, heartbeat=(node.heartbeat_s, node.grace_s))
        study = optuna.create_study(
            study_name=study_name,
            storage=storage,
            sampler=setup.sampler,
            pruner=setup.pruner,
            directions=setup.directions,
            load_if_exists=True,
        )
        directions = [d.name.lower() for d in study.directions]
        if directions != setup.directions:
            raise SweepConfigError(
                f"rlspeed: invalid hydra.sweeper.direction={setup.directions}: study "
                f"'{study_name}' in {storage_spec} was created with {directions}; "
                "use another hydra.sweeper.study_name or storage"
            )
        _name_objectives(study, setup.objectives, storage_spec)
        if setup.pruner_off:
            log.info("No pruning: %s", setup.pruner_off)
        study_id = storage.get_study_id_from_name(study_name)
        storage.set_study_system_attr(study_id, PRUNER_ATTR, setup.pruner_cfg)
        keeper = TrialKeeper(study, storage, node.heartbeat_s, node.grace_s)
        stale = keeper.fail_stale()

        # Jobs in worker processes (hydra/launcher=joblib) stop when this process is gone.
        os.environ[SWEEP_PID_VARIABLE] = str(os.getpid())
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / "multirun.yaml").write_text(secrets.mask(OmegaConf.to_yaml(config)))
        trials = counted(study.get_trials(deepcopy=False))
        running = sum(t.state == TrialState.RUNNING for t in trials)
        log.info(
            "Optuna study '%s' in %s: %d finished trial(s), %d running in other sweeps, "
            "running %d more (n_trials=%d)",
            study_name,
            storage_spec,
            len(trials) - running,
            running,
            max(node.n_trials - len(trials), 0),
            node.n_trials,
        )
        parent = None
        if OmegaConf.select(config, "tracking.name", default=None) == "mlflow":
            parent = StudyRun.open(config.tracking, study, study_id, storage, storage_spec)
            parent.fail_stale_children(stale)

        returns: list[Sequence[JobReturn]] = []
        status = "FAILED"
        try:
            returns = self._run_trials(study, setup, node, storage_spec, parent, legal, keeper)
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            keeper.close()
            files = write_results(study, storage_spec, sweep_dir)
            show_best(study)
            if parent is not None:
                parent.finish(study, files, status)
                self._say_unsent(parent, sweep_dir)
        return returns

    def _say_unsent(self, parent: StudyRun, sweep_dir: Path) -> None:
        """The sweep's last line when the tracking store lost records: which, and where
        they are kept."""
        lost = []
        if self.unsent:
            numbers = ", ".join(map(str, sorted(self.unsent)))
            lost.append(f"trial(s) {numbers}: {next(iter(self.unsent.values()))}")
        if parent.failure is not None:
            lost.append(f"the study's parent run {parent.run_id}: {parent.failure}")
        if lost:
            log.warning(
                "rlspeed: not everything reached MLflow (%s); every trial's results are in "
                "the study and its folder under %s",
                "; ".join(lost),
                sweep_dir,
            )

    def _run_trials(
        self,
        study: Any,
        setup: SweepSetup,
        node: DictConfig,
        storage_spec: str,
        parent: StudyRun | None,
        legal: Any,
        keeper: TrialKeeper,
    ) -> list[Sequence[JobReturn]]:
        config = self.config
        assert config is not None
        extra: list[str] = []
        if node.report_every is not None and "eval_every" in config:
            extra.append(f"eval_every={node.report_every}")
            # A run evaluates on its log rows: it logs at least as often as it reports.
            if config.get("log_every", 0) > node.report_every:
                extra.append(f"log_every={node.report_every}")
        # rlspeed's jobs attach to their trial (rlspeed.sweep); other apps just get params.
        is_trial_job = OmegaConf.select(config, "trial.number", default="absent") != "absent"
        if is_trial_job:
            extra += [
                f"trial.storage={quote(storage_spec)}",
                f"trial.study_name={quote(study.study_name)}",
                f"trial.keep_resume={str(node.keep_resume).lower()}",
            ]
        if parent is not None:
            extra.append(f"tracking.parent_run_id={quote(parent.run_id)}")

        returns: list[Sequence[JobReturn]] = []
        ran = failed = 0
        next_job_idx = 0
        while True:
            if _grid_exhausted(setup.sampler, study):
                log.info("The grid is exhausted: every combination has been tried")
                break
            pending = []
            try:
                # Counting and asking under the study's lock: sweeps sharing it on a database
                # server never both ask for its last trial.
                lock = database_lock(storage_engine(keeper.storage), f"study:{study.study_name}")
                with lock, warnings.catch_warnings():
                    # The heartbeats are the sweeper's, not optimize's.
                    warnings.filterwarnings("ignore", "Heartbeat of storage is supposed")
                    remaining = node.n_trials - len(counted(study.get_trials(deepcopy=False)))
                    for _ in range(min(node.n_jobs, remaining)):
                        try:
                            pending.append(study.ask(fixed_distributions=setup.space.distributions))
                            keeper.claim(pending[-1])
                        except OSError as error:
                            raise _unwritable(storage_spec, error, "a new trial") from None
                if not pending:
                    break
                trials = study.get_trials(deepcopy=False)
                launch: list[tuple[Any, list[str]]] = []
                for trial in list(pending):
                    if is_surplus(trial._trial_id, trials, node.n_trials):
                        # Another sweep of the study asked for the last trials meanwhile.
                        keeper.mark_surplus(trial, node.n_trials)
                        _tell(study, trial, state=TrialState.FAIL)
                        pending.remove(trial)
                        log.info("Trial %d: not run, n_trials is reached", trial.number)
                        continue
                    if setup.custom_search_space is not None:
                        setup.custom_search_space(config, trial)
                    overrides = setup.space.overrides(trial.params) + extra
                    if is_trial_job:
                        overrides.append(f"trial.number={trial.number}")
                    try:
                        legal(overrides)
                    except Exception as error:  # noqa: BLE001 - reported, the trial FAILs
                        log.warning("Trial %d cannot be composed: %s", trial.number, error)
                        keeper.release(trial)
                        _tell(study, trial, state=TrialState.FAIL)
                        pending.remove(trial)
                        failed += 1
                        ran += 1
                        continue
                    launch.append((trial, overrides))
                if launch:
                    numbers = [trial.number for trial, _ in launch]
                    consecutive = numbers == list(range(numbers[0], numbers[0] + len(numbers)))
                    job_idx = numbers[0] if consecutive else next_job_idx
                    batch = [overrides for _, overrides in launch]
                    if is_submitit(self.launcher):  # a lost SLURM job fails its trial alone
                        results = launch_each(self.launcher, batch, job_idx)
                    else:
                        results = self.launcher.launch(batch, initial_job_idx=job_idx)
                    next_job_idx = max(next_job_idx, job_idx + len(launch))
                    returns.append(results)
                    for (trial, _), ret in zip(launch, results, strict=True):
                        keeper.release(trial)
                        try:
                            failed += self._record(study, trial, ret, setup)
                        except OSError as error:
                            raise _unwritable(storage_spec, error, _result_of(trial, ret)) from None
                        pending.remove(trial)
                        ran += 1
            finally:
                # Interrupted (Ctrl-C) or broken: trials of this batch can no longer finish.
                for trial in pending:
                    keeper.release(trial)
                    # Unless it was told meanwhile, or the storage cannot record it (a full disk).
                    with contextlib.suppress(ValueError, OSError):
                        _tell(study, trial, state=TrialState.FAIL)
            stale = keeper.fail_stale()  # other sweeps' trials that will not finish
            if parent is not None:
                parent.fail_stale_children(stale)
            if failed and failed / ran > node.max_failure_rate:
                raise RLSpeedError(
                    f"rlspeed: sweep stopped: {failed} of {ran} trial(s) failed, more than "
                    f"hydra.sweeper.max_failure_rate={node.max_failure_rate} allows "
                    "(see the failed jobs' logs in the sweep folder)"
                )
        return returns

    def _record(self, study: Any, trial: Any, ret: JobReturn, setup: SweepSetup) -> int:
        """Record how a job ended; returns 1 if the trial failed, else 0."""
        # A SLURM job lost without a result has no Hydra config (_submitit).
        output_dir = None
        if ret.hydra_cfg is not None:
            output_dir = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir")
        state = trial.storage.get_trial(trial._trial_id).state
        if state != TrialState.RUNNING:
            # Another sweep judged it stale (this one gave no heartbeat for grace_s seconds,
            # e.g. a suspended machine): Optuna cannot change a finished trial.
            log.warning(
                "Trial %d was marked %s by another sweep while its job ran: the job's "
                "result is not in the study (its folder: %s)",
                trial.number,
                state.name,
                output_dir,
            )
            return 0
        if output_dir:
            trial.set_user_attr("output_dir", str(output_dir))
            errors = _tracking_errors(Path(output_dir))
            if errors:
                self.unsent[trial.number] = errors[0]
        if ret.status == JobStatus.COMPLETED:
            values = _objective_values(
                ret.return_value, setup.objectives, output_dir, len(setup.directions)
            )
            if not isinstance(values, str):
                _tell(study, trial, values=values)
                log.info("Trial %d: COMPLETE, %s", trial.number, _fmt_values(study, values))
                return 0
            reason = values
        else:
            error = ret._return_value  # the exception the job raised
            if isinstance(error, optuna.TrialPruned):
                _tell(study, trial, state=TrialState.PRUNED)
                log.info("Trial %d: PRUNED, %s", trial.number, error)
                return 0
            reason = " ".join(str(error).split()) or type(error).__name__
        _tell(study, trial, state=TrialState.FAIL)
        log.warning("Trial %d: FAIL: %s", trial.number, reason)
        return 1


def _unwritable(storage_spec: str, error: OSError, what: str) -> RLSpeedError:
    """The sweep's last line when its study's storage takes no more writes (a full disk
    under a journal): going on would lose every later trial's result too."""
    return RLSpeedError(
        f"rlspeed: sweep stopped: the study's storage {storage_spec} could not record {what} "
        f"({error.strerror or error}); free some space and run the same command again"
    )


def _result_of(trial: Any, ret: JobReturn) -> str:
    """A trial's outcome, and where its run keeps it, for ``_unwritable``."""
    output_dir = None if ret.hydra_cfg is None else ret.hydra_cfg.hydra.runtime.output_dir
    outcome = "result" if ret.status == JobStatus.COMPLETED else "failure"
    return f"trial {trial.number}'s {outcome} (its run's results are in {output_dir})"


def _tracking_errors(output_dir: Path) -> list[str]:
    """Why a finished run did not record everything (its metrics.json ``errors``)."""
    try:
        return list(json.loads((output_dir / "metrics.json").read_text()).get("errors") or [])
    except (OSError, ValueError, AttributeError):  # no metrics.json: the trial says why
        return []


def _tell(study: Any, trial: Any, **kwargs: Any) -> None:
    try:
        study.tell(trial, **kwargs)
    except RuntimeError as error:
        # A grid sampler stops the study when its grid is done, which only study.optimize()
        # allows; the trial is recorded all the same (and _grid_exhausted ends the sweep).
        if "Study.stop" not in str(error):
            raise


def _grid_exhausted(sampler: Any, study: Any) -> bool:
    return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study)


def _name_objectives(study: Any, objectives: list[str] | None, storage_spec: str) -> None:
    """Record the objectives' metric names in the study (its plots and table use them);
    a study resumed with other objectives would mix their values."""
    if study.metric_names is not None and study.metric_names != objectives:
        raise SweepConfigError(
            f"rlspeed: invalid hydra.sweeper.objectives={_list_text(objectives)}: study "
            f"'{study.study_name}' in {storage_spec} optimizes "
            f"{_list_text(study.metric_names)}; use another hydra.sweeper.study_name or storage"
        )
    if objectives is not None and study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(objectives)


def _list_text(names: list[str] | None) -> str:
    return "null" if names is None else f"[{','.join(names)}]"


def _objective_values(
    value: Any, objectives: list[str] | None, output_dir: str | None, n_objectives: int
) -> list[float] | str:
    """A finished job's objective values, rounded as studies record them (study_value):
    the numbers ``objectives`` names in its metrics.json, else its return value.
    Returns why there are none instead when they cannot be had."""
    if objectives is not None:
        try:
            metrics = json.loads((Path(output_dir or ".") / "metrics.json").read_text())
        except (OSError, ValueError) as error:
            return f"no metrics.json in its folder {output_dir} ({error})"
        values = [metrics.get(name) for name in objectives]
        what = f"metrics.json's {_list_text(objectives)} are {values}"
    else:
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        what = f"the job returned {value!r}"
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) != n_objectives or not all(math.isfinite(v) for v in numbers):
        return f"{what}, not {n_objectives} finite number(s)"
    return [study_value(v) for v in numbers]


def _objective_names(study: Any) -> list[str]:
    """The objectives' metric names; ``value`` (or ``objective <i>``) without them."""
    if study.metric_names is not None:
        return list(study.metric_names)
    if len(study.directions) == 1:
        return ["value"]
    return [f"objective {i}" for i in range(len(study.directions))]


def _fmt_values(study: Any, values: Sequence[float]) -> str:
    """``name value`` per objective, e.g. ``score 0.742, wall_time_s 12.31``."""
    names = _objective_names(study)
    return ", ".join(f"{name} {value:.6g}" for name, value in zip(names, values, strict=True))


# --- results -------------------------------------------------------------------------


def _best_trials(study: Any) -> list[Any]:
    """Up to TOP_TRIALS complete trials, best first; the Pareto front if multi-objective
    (all of it, in the order of its first objective, best first)."""
    if len(study.directions) > 1:
        first = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        return sorted(study.best_trials, key=lambda t: (t.values[0], t.number), reverse=first)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(complete, key=lambda t: t.value, reverse=maximize)[:TOP_TRIALS]


def _counts(study: Any) -> dict[str, int]:
    counts = {state.name: 0 for state in FINISHED}
    for trial in study.get_trials(deepcopy=False, states=FINISHED):
        if SURPLUS_ATTR not in trial.user_attrs:  # never ran
            counts[trial.state.name] += 1
    return counts


def write_results(study: Any, storage_spec: str, sweep_dir: Path) -> list[Path]:
    """``optimization_results.yaml``, the trials table and Optuna's plots in the sweep
    folder; returns the files written."""
    files = []
    results: dict[str, Any] = {
        "name": "optuna",
        "study_name": study.study_name,
        "storage": secrets.mask(storage_spec),
        "directions": [d.name.lower() for d in study.directions],
        "objectives": study.metric_names,
        "trials": _counts(study),
    }
    best = _best_trials(study)
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
    path = sweep_dir / "optimization_results.yaml"
    OmegaConf.save(OmegaConf.create(results), path)
    files.append(path)
    try:
        table = sweep_dir / "trials.csv"
        study.trials_dataframe().to_csv(table, index=False)
        files.append(table)
    except Exception as error:  # noqa: BLE001 - results must not sink the sweep
        log.warning("No trials table: %s", error)
    if best:
        files += write_plots(study, sweep_dir / "plots")
    return files


# Parameters of the contour plot: its grid has one panel per pair, unreadable beyond 4.
CONTOUR_PARAMS = 4
CONTOUR_PANEL_PX = 280


def write_plots(study: Any, out_dir: Path) -> list[Path]:
    """Parameter importance, contour (of the CONTOUR_PARAMS most important parameters),
    optimization history and, for several objectives, the Pareto front: HTML (plotly,
    interactive, sharing one ``plotly.min.js``) and PNG (matplotlib; plotly's static export
    needs a browser). Plots of one objective show the first."""
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
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # e.g. "unique value length < 2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        top = _top_params(study, target.get("target"))
        # The contour's grid grows with its parameters (None: all of them, few enough).
        big_contour = top is not None and len(top) > 2
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
                    size = CONTOUR_PANEL_PX * len(top)
                    fig.update_layout(width=size + 200, height=size)
                html = out_dir / f"{name}.html"
                # plotly.js (3.6 MB) once, as plotly.min.js beside the pages.
                fig.write_html(html, include_plotlyjs="directory")
                _add_plotly_fallback(html)
                files.append(html)
                axes = getattr(vis_mpl, f"plot_{name}")(study, **args)
                figure = np.atleast_1d(axes).flat[0].figure
                if name == "contour" and big_contour:
                    figure.set_size_inches(2.5 * len(top) + 1.5, 2.5 * len(top))
                png = out_dir / f"{name}.png"
                figure.savefig(png, dpi=100, bbox_inches="tight")
                plt.close(figure)
                files.append(png)
            except Exception as error:  # noqa: BLE001 - e.g. too few trials for importances
                log.warning("No %s plot: %s", name, " ".join(str(error).split()))
    optuna.logging.set_verbosity(verbosity)
    script = out_dir / "plotly.min.js"
    if script.exists():
        files.append(script)
    return files


LOCAL_PLOTLY = '<script charset="utf-8" src="plotly.min.js"></script>'


def _add_plotly_fallback(page: Path) -> None:
    """Load plotly.js from its CDN where the page cannot reach the plotly.min.js beside it:
    MLflow shows an HTML artifact alone (in an iframe of its own), so the relative script
    is not found there and the plot would stay blank."""
    from plotly.offline import get_plotlyjs_version

    cdn = f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"
    load = f"document.write('<script src=\"{cdn}\"><\\/script>')"
    fallback = f"<script>window.Plotly || {load}</script>"
    page.write_text(page.read_text().replace(LOCAL_PLOTLY, LOCAL_PLOTLY + fallback, 1))


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

    counts = _counts(study)
    best = _best_trials(study)
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
        table.add_row(name, *[_fmt_param(t.params.get(name)) for t in best])
    Console().print(table)


def _fmt_param(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


# --- MLflow ----------------------------------------------------------------------------


class StudyRun:
    """The study's MLflow parent run: trials nest under it; it gets the results at the end.

    Resuming a study reuses its parent run. MLflow params cannot change once logged, so the
    best params are logged as params (``best.<name>``) the first time and kept current as
    tags of the same names; ``best_value`` is a metric stepped by the finished trial count.
    """

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        # Why something could not be sent to the parent run (None while all was).
        self.failure: str | None = None

    @classmethod
    def open(
        cls, tracking: DictConfig, study: Any, study_id: int, storage: Any, storage_spec: str
    ) -> StudyRun:
        from rlspeed.tracking.mlflow import (
            mlflow_client,
            resolve_uri,
            server_credentials,
            use_mlflow_defaults,
        )

        use_mlflow_defaults()
        import mlflow

        uri = resolve_uri(tracking)
        bare_uri, credentials = server_credentials(uri)
        os.environ.update(credentials)  # where MLflow reads a server's user and password
        client = mlflow_client(bare_uri or mlflow.get_tracking_uri())
        experiment = client.get_experiment_by_name(tracking.experiment)
        if experiment is None:
            try:
                experiment_id = client.create_experiment(tracking.experiment)
            except Exception:  # noqa: BLE001 - created meanwhile by another process
                experiment_id = client.get_experiment_by_name(tracking.experiment).experiment_id
        else:
            experiment_id = experiment.experiment_id
        # Recorded in the study: without a server's user and password, a database's masked.
        where = {"uri": secrets.mask(bare_uri or ""), "experiment": tracking.experiment}
        known = storage.get_study_system_attrs(study_id).get(PARENT_ATTR)
        if known and {k: known.get(k) for k in where} == where:
            try:
                run = client.get_run(known["run_id"])
                if run.info.lifecycle_stage == "active":
                    client.update_run(run.info.run_id, status="RUNNING")
                    log.info("MLflow: resuming the study's parent run %s", run.info.run_id)
                    return cls(client, run.info.run_id)
            except Exception:  # noqa: BLE001 - deleted or gone: start a new parent run
                pass
        sampler = type(study.sampler).__name__
        pruner = type(study.pruner).__name__
        run = client.create_run(
            experiment_id,
            run_name=study.study_name,
            tags={
                "optuna.study": study.study_name,
                "optuna.storage": secrets.mask(storage_spec),
                "optuna.sampler": sampler,
                "optuna.pruner": pruner,
                "optuna.directions": ",".join(d.name.lower() for d in study.directions),
            },
        )
        storage.set_study_system_attr(study_id, PARENT_ATTR, {**where, "run_id": run.info.run_id})
        log.info("MLflow: study parent run %s", run.info.run_id)
        return cls(client, run.info.run_id)

    def _try(self, what: str, send: Callable[[], None]) -> None:
        """``send()``, or, if the tracking store fails, one warning: a store that dies
        mid-sweep costs its copy of the results, not the sweep."""
        from rlspeed.tracking import cause

        try:
            send()
        except Exception as error:  # noqa: BLE001 - MLflow raises its own and requests' errors
            if self.failure is None:
                log.warning(
                    "MLflow: could not %s (%s); the sweep goes on, its results are in the "
                    "study and the sweep folder",
                    what,
                    cause(error),
                )
            self.failure = f"{what} ({cause(error)})"

    def fail_stale_children(self, numbers: list[int]) -> None:
        """Child runs of trials a killed sweep left running end FAILED, like their trials."""
        if numbers:
            self._try("end stale trials' runs", lambda: self._fail_children(numbers))

    def _fail_children(self, numbers: list[int]) -> None:
        run = self.client.get_run(self.run_id)
        children = self.client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.run_id}' "
            "and attributes.status = 'RUNNING'",
        )
        for child in children:
            if child.data.tags.get("optuna.trial") in {str(n) for n in numbers}:
                self.client.set_terminated(child.info.run_id, status="FAILED")

    def finish(self, study: Any, files: list[Path], status: str) -> None:
        """The study's results and files into the parent run, which then ends."""
        self._try("record the study's results", lambda: self._log_results(study, files))
        self._try("end the study's run", lambda: self.client.set_terminated(self.run_id, status))

    def _log_results(self, study: Any, files: list[Path]) -> None:
        client, run_id = self.client, self.run_id
        counts = _counts(study)
        step = sum(counts.values())
        for state, count in counts.items():
            client.log_metric(run_id, f"trials_{state.lower()}", count, step=step)
        best = _best_trials(study)
        if best and len(study.directions) == 1:
            trial = best[0]
            client.log_metric(run_id, "best_value", trial.value, step=step)
            client.set_tag(run_id, "best_trial", str(trial.number))
            logged = client.get_run(run_id).data.params
            for name, value in trial.params.items():
                key = f"best.{name}"
                if key not in logged:
                    client.log_param(run_id, key, value)
                client.set_tag(run_id, key, str(value))
        elif best:
            client.set_tag(run_id, "pareto_front", ",".join(str(t.number) for t in best))
        for path in files:
            client.log_artifact(
                run_id,
                str(path),
                artifact_path="plots" if path.parent.name == "plots" else None,
            )
