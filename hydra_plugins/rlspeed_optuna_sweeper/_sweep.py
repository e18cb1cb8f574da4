"""The Optuna sweeper's loop: a persistent study, trials launched in batches, pruning.

Every batch asks the study for ``n_jobs`` trials (``batch_size`` where that is more),
launches them as one batch of Hydra jobs (in parallel processes with
``hydra/launcher=joblib``; on the fused path as lanes of one program, ``_batch``) and tells
the study how each ended (``_outcomes``):
COMPLETE with the job's return value, PRUNED when the job raised ``optuna.TrialPruned``
(the job side is :mod:`rlspeed.sweep`), FAIL otherwise. Finished trials of earlier sweeps
of the same study count toward ``n_trials``, so running the same command again resumes;
so do the live trials of sweeps of the study running at the same time (see ``_trials``).
The study's name and storage come from ``_study``, its results and plots are written by
``_results``, its MLflow parent run is kept by ``_parent_run``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.study import StudyDirection
from optuna.trial import TrialState

from hydra_plugins.rlspeed_optuna_sweeper._batch import batches_trials, launch_batched
from hydra_plugins.rlspeed_optuna_sweeper._defaults import enqueue_defaults
from hydra_plugins.rlspeed_optuna_sweeper._outcomes import record, tell
from hydra_plugins.rlspeed_optuna_sweeper._parent_run import StudyRun
from hydra_plugins.rlspeed_optuna_sweeper._results import (
    show_best,
    warn_unwritten,
    write_results,
    writing,
)
from hydra_plugins.rlspeed_optuna_sweeper._seeding import TrialSeededSampler
from hydra_plugins.rlspeed_optuna_sweeper._space import (
    SweepConfigError,
    SweepSetup,
    build,
    composition_signature,
)
from hydra_plugins.rlspeed_optuna_sweeper._study import (
    name_objectives,
    study_name,
    sweep_storage,
)
from hydra_plugins.rlspeed_optuna_sweeper._submitit import is_submitit, launch_each
from hydra_plugins.rlspeed_optuna_sweeper._trials import TrialKeeper, counted, is_surplus
from rlspeed import secrets
from rlspeed.config_tree import quote
from rlspeed.errors import RLSpeedError
from rlspeed.sweep import (
    PRUNER_ATTR,
    SWEEP_PID_VARIABLE,
    database_lock,
    open_storage,
    storage_engine,
)

log = logging.getLogger(__name__)


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
        # One console line per trial (``_outcomes.record``): the launchers' "Launching N jobs" and
        # each job's overrides, internal keys and all, stay in the trials' .hydra/ files.
        for launcher_log in LAUNCHER_LOGGERS:
            logging.getLogger(launcher_log).setLevel(logging.WARNING)
        name = study_name(config)
        storage_spec = sweep_storage(config)
        storage = open_storage(storage_spec, heartbeat=(node.heartbeat_s, node.grace_s))
        sampler = setup.sampler
        if setup.sampler_for is not None:  # seeded: each trial from its own seed
            sampler = TrialSeededSampler(setup.sampler, setup.sampler_for)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=setup.pruner,
            directions=[StudyDirection[direction.upper()] for direction in setup.directions],
            load_if_exists=True,
        )
        directions = [d.name.lower() for d in study.directions]
        if directions != setup.directions:
            raise SweepConfigError(
                f"rlspeed: invalid hydra.sweeper.direction={setup.directions}: study "
                f"'{name}' in {storage_spec} was created with {directions}; "
                "use another hydra.sweeper.study_name or storage"
            )
        # An rlspeed trial returns its score: the study names it so (optuna-dashboard and
        # the plots would say "Objective 0").
        named = setup.objectives or (["score"] if "trial" in config else None)
        name_objectives(study, named, storage_spec)
        if setup.pruner_off:
            log.info("No pruning: %s", setup.pruner_off)
        study_id = storage.get_study_id_from_name(name)
        storage.set_study_system_attr(study_id, PRUNER_ATTR, setup.pruner_cfg)
        keeper = TrialKeeper(study, storage, node.heartbeat_s, node.grace_s)
        stale = keeper.fail_stale()

        # Jobs in worker processes (hydra/launcher=joblib) stop when this process is gone.
        os.environ[SWEEP_PID_VARIABLE] = str(os.getpid())
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            with writing(sweep_dir / "multirun.yaml") as path:
                path.write_text(secrets.mask(OmegaConf.to_yaml(config)))
        except OSError as error:  # a trial that cannot write its folder fails on its own
            warn_unwritten(error, storage_spec)
        trials = counted(study.get_trials(deepcopy=False))
        running = sum(t.state == TrialState.RUNNING for t in trials)
        log.info(
            "Optuna study '%s' in %s: %d finished trial(s), %d running in other sweeps, "
            "running %d more (n_trials=%d)",
            name,
            storage_spec,
            len(trials) - running,
            running,
            max(node.n_trials - len(trials), 0),
            node.n_trials,
        )
        try:  # a new study's first trial: the composed config
            if node.enqueue_defaults:
                enqueue_defaults(study, storage, config, setup.space, setup.sampler)
        except OSError as error:
            raise _unwritable(storage_spec, error, "the run's defaults as trial 0") from None
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
            study_at = secrets.mask(storage_spec)
            where = f"rlspeed: sweep folder {sweep_dir.resolve()}; study in {study_at}"
            if parent is not None:
                where += f"; MLflow parent run {parent.run_id}"
            log.info(where)
            for name, link in parent.links.items() if parent is not None else ():
                log.info("%s: %s", name, link)
            if parent is not None:
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
        began = time.monotonic()
        batched = batches_trials(config, self.launcher, node.batch_size)
        parallel = node.n_jobs if node.n_jobs is not None else launcher_jobs(config)
        ran = failed = 0
        next_job_idx = 0
        composable: set[Any] = set()  # composition_signature of trials that composed
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
                    for _ in range(min(max(parallel, node.batch_size), remaining)):
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
                        tell(study, trial, state=TrialState.FAIL)
                        pending.remove(trial)
                        log.info("Trial %d: not run, n_trials is reached", trial.number)
                        continue
                    if setup.custom_search_space is not None:
                        setup.custom_search_space(config, trial)
                    overrides = setup.space.overrides(trial.params) + extra
                    if is_trial_job:
                        overrides.append(f"trial.number={trial.number}")
                    signature = composition_signature(trial.distributions, trial.params)
                    try:
                        # A batch composes each trial's config anyway.
                        if not batched and signature not in composable:
                            legal(overrides)
                            composable.add(signature)
                    except Exception as error:  # noqa: BLE001 - reported, the trial FAILs
                        log.warning("Trial %d cannot be composed: %s", trial.number, error)
                        keeper.release(trial)
                        tell(study, trial, state=TrialState.FAIL)
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
                    if batched:
                        assert self.hydra_context is not None
                        results = launch_batched(self.hydra_context, config, batch, job_idx)
                    elif is_submitit(self.launcher):  # a lost SLURM job fails its trial alone
                        results = launch_each(self.launcher, batch, job_idx)
                    else:
                        results = self.launcher.launch(batch, initial_job_idx=job_idx)
                    next_job_idx = max(next_job_idx, job_idx + len(launch))
                    returns.append(results)
                    for (trial, _), ret in zip(launch, results, strict=True):
                        keeper.release(trial)
                        try:
                            failed += record(study, trial, ret, setup, self.unsent)
                        except OSError as error:
                            raise _unwritable(storage_spec, error, _result_of(trial, ret)) from None
                        pending.remove(trial)
                        ran += 1
                    log.info(progress_line(study, node.n_trials, ran, time.monotonic() - began))
            finally:
                # Interrupted (Ctrl-C) or broken: trials of this batch can no longer finish.
                for trial in pending:
                    keeper.release(trial)
                    # Unless it was told meanwhile, or the storage cannot record it (a full disk).
                    with contextlib.suppress(ValueError, OSError):
                        tell(study, trial, state=TrialState.FAIL)
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


def progress_line(study: Any, n_trials: int, ran: int, elapsed: float) -> str:
    """The sweep so far, after each batch of trial lines: trials the study has ended (any
    sweep's), how they ended, the best so far, and this sweep's elapsed time and ETA (its
    trials' mean time per trial for the ones left)."""
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state for t in trials if t.state.is_finished())
    ended = sum(states.values())
    kinds = ", ".join(
        f"{states[state]} {state.name.lower()}"
        for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        if states[state]
    )
    line = f"Sweep: {ended}/{n_trials} trials ended ({kinds or 'none yet'})"
    if len(study.directions) == 1 and states[TrialState.COMPLETE]:
        best = study.best_trial
        line += f", best {best.value:.4g} (trial {best.number})"
    left = max(n_trials - ended, 0)
    eta = _clock(elapsed / ran * left) if ran and left else "0:00:00"
    return f"{line}, {_clock(elapsed)} elapsed, ETA {eta}"


def _clock(seconds: float) -> str:
    minutes, second = divmod(round(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}:{minute:02d}:{second:02d}"


# The loggers of the launchers a sweep's jobs go through.
LAUNCHER_LOGGERS = (
    "hydra._internal.core_plugins.basic_launcher",
    "hydra_plugins.hydra_joblib_launcher._core",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
)


def launcher_jobs(config: DictConfig) -> int:
    """How many jobs the launcher runs at once: joblib's n_jobs (-1: one per core), else 1."""
    n_jobs = OmegaConf.select(config, "hydra.launcher.n_jobs", default=None)
    if n_jobs is None:
        return 1
    return (os.cpu_count() or 1) if n_jobs == -1 else int(n_jobs)


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


def _grid_exhausted(sampler: Any, study: Any) -> bool:
    return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study)
