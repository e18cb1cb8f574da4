"""One training run, or a sweep's batch of them: the one place with side effects. It builds
the parts the config names, drives the training loop (``rlspeed.core.algos.loops``) chunk by
chunk, and around each chunk records it (tracker, history, progress), evaluates, hands new
scores to the Optuna trial (whose pruner may stop it), checkpoints when due and takes
interrupts; however training ends, it writes every file (``rlspeed.recording``)."""

from __future__ import annotations

import logging
import multiprocessing
import sys
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlspeed import slurm
from rlspeed.checkpoint import run_folder, training_keys, why
from rlspeed.config import env_id, is_fused, task_label
from rlspeed.config_tree import flatten, to_yaml
from rlspeed.core.algos import import_named
from rlspeed.core.algos.loops import CHECKPOINT_FILES, TrainResult
from rlspeed.core.algos.loops.host import HostTraining, ResumeMismatch
from rlspeed.errors import (
    ConfigError,
    EnvFailed,
    Interrupted,
    RLSpeedError,
    deferred_interrupts,
    interrupt,
)
from rlspeed.gym_ids import GROUP as GYM_GROUP
from rlspeed.gym_ids import tuned_defaults
from rlspeed.host_records import check_finite, env_failure, record_chunk, report, trains_on
from rlspeed.monitor import RunMonitor, to_log_file
from rlspeed.recording import (
    CheckpointSchedule,
    Run,
    Unrecorded,
    end,
    ending,
    set_agent_files,
    summary,
    write_now,
    write_text,
)
from rlspeed.registry import ALGOS, BACKENDS, ENGINES, TASKS, TRACKERS
from rlspeed.seed_training import seed_training
from rlspeed.seed_workers import SeedWorkers
from rlspeed.sweep import TrialReporter
from rlspeed.tracking import cause
from rlspeed.validation import CheckedRun, check
from rlspeed.video import VIDEO_FOLDER, VideoSchedule, film_or_why

log = logging.getLogger("rlspeed")


def _output_dir() -> Path:
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def run(cfg: DictConfig, checked: CheckedRun | None = None) -> float:
    """Train as configured; returns the task's score (greedy evaluation). ``checked``: the
    command line's check of this config, where it made one (else it is checked here)."""
    out_dir = _output_dir()
    # A requeued SLURM job continues the run its earlier attempt saved in this folder.
    continued = slurm.continued_folder(out_dir) if not cfg.resume else None
    if continued is not None:
        cfg = cfg.copy()
        cfg.resume = str(continued)
        checked = None  # another config than the one checked: this one goes on from a folder
        log.info(
            "rlspeed: SLURM job %s, attempt %d: continuing the run saved in %s",
            slurm.job_id(),
            slurm.restarts() + 1,
            continued,
        )
    cfg = _with_tuned_defaults(cfg)
    if checked is None:
        checked = check(cfg)
    if checked.evaluated is not None:  # mode=eval
        from rlspeed.evaluate import evaluate_checkpoint

        return evaluate_checkpoint(checked.cfg, checked.evaluated, out_dir)
    started = _start(checked, out_dir, continued is not None)
    status, failure = "FAILED", None
    # A scheduler's SIGTERM (preemption, `timeout`), or SLURM's SIGUSR2, ends the run like
    # Ctrl-C: KILLED, checkpointed (and after SIGUSR2 the SLURM job is requeued).
    with slurm.StopSignals(interrupt):
        try:
            if is_fused(started.cfg):
                (result,) = _train_fused([started])
                if isinstance(result, BaseException):
                    raise result
            else:
                result = _train_host(started)
            status = "FINISHED"
        except KeyboardInterrupt as stop:
            status = "KILLED"
            _interrupted(stop, out_dir)
            raise
        except started.pruned_error as pruned:
            status = _pruned(started, pruned)
            raise
        except Exception as error:
            failure = str(error).removeprefix("rlspeed: ")  # recorded with the run
            raise
        finally:
            unrecorded = end(started, status, failure)
            if unrecorded and status != "FINISHED":  # beside the error or interrupt on its way
                print(unrecorded.line, file=sys.stderr)
    return _finished(started, result, unrecorded)


def _with_tuned_defaults(cfg: DictConfig) -> DictConfig:
    """The job's config with the tuned defaults of its Gymnasium id (``rlspeed.gym_ids``),
    composed again from the job's overrides where it has them."""
    if not HydraConfig.initialized():
        return cfg
    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    name = tuned_defaults(cfg, overrides)
    if name is None:
        return cfg
    log.info(
        "rlspeed: %s on %s takes rlspeed's settings for that env (conf/algo_task/%s.yaml;"
        " tuned=false: the algorithm's general ones)",
        cfg.algo.name,
        cfg.task.id,
        name,
    )
    return compose(hydra_cfg.job.config_name, [*overrides, f"{GYM_GROUP}={name}"])


def run_trials(cfgs: list[DictConfig], out_dirs: list[Path]) -> list[float | Exception]:
    """Train a sweep's trials on the fused path as one program: configs that differ only in
    traced hyperparameters, each run in its own folder with all a lone run records. Returns
    each trial's score, or the exception it ended with (pruned, diverged, a config it
    cannot run); an interrupt ends them all, each saved as KILLED."""
    outcomes: list[float | Exception | None] = [None] * len(cfgs)
    started: dict[int, Run] = {}
    for index, (cfg, out_dir) in enumerate(zip(cfgs, out_dirs, strict=True)):
        try:
            started[index] = _start(check(cfg), out_dir, continued=False)
        except Exception as error:  # noqa: BLE001 - this trial's failure, not the batch's
            outcomes[index] = error
    if not started:
        return [outcome for outcome in outcomes if outcome is not None]
    results: list[TrainResult | Exception] = []
    with slurm.StopSignals(interrupt):
        try:
            results = _train_fused(list(started.values()))
        except KeyboardInterrupt as stop:  # every trial ends KILLED, as a lone run would
            _interrupted(stop, next(iter(started.values())).out_dir.parent)
            for trial in started.values():
                end(trial, "KILLED")
            raise
        except Exception as error:  # noqa: BLE001 - the program failed: each of its trials
            results = [error] * len(started)
    endings = {}
    for (index, trial), result in zip(started.items(), results, strict=True):
        status, failure = "FINISHED", None
        if isinstance(result, Exception):
            status = _pruned(trial, result) if isinstance(result, trial.pruned_error) else "FAILED"
            failure = str(result).removeprefix("rlspeed: ") if status == "FAILED" else None
        endings[index] = ending(trial, status, failure)
        next(endings[index])  # every trial's files first
    for (index, trial), result in zip(started.items(), results, strict=True):
        unrecorded = next(endings[index])
        if isinstance(result, Exception):
            if unrecorded:
                log.warning(unrecorded.line)
            outcomes[index] = result
            continue
        try:
            outcomes[index] = _finished(trial, result, unrecorded)
        except Exception as error:  # noqa: BLE001 - what this trial could not record
            outcomes[index] = error
    return [outcome for outcome in outcomes if outcome is not None]


# ---------------------------------------------------------------- setting a run up


def _start(checked: CheckedRun, out_dir: Path, continued: bool) -> Run:
    """Set up a checked run: its folder and config file, its tracked run and monitor."""
    cfg, resumed = checked.cfg, checked.resumed
    if checked.unresumable is not None:
        log.info(checked.unresumable)
    task, engine = TASKS.get(cfg.task.name), ENGINES.get(cfg.env.name)
    BACKENDS.get(cfg.backend.name).setup(cfg.backend, cfg.seed)

    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        write_text(out_dir / "config.yaml", to_yaml(cfg))
    except OSError as error:
        raise RLSpeedError(
            f"rlspeed: could not write config.yaml in {out_dir}: {cause(error)}"
        ) from None
    choices = {
        "backend": cfg.backend.name,
        "env": cfg.env.name,
        "algo": cfg.algo.name,
        "task": task_label(cfg.task),  # with its env's id: gym-Hopper-v5
    }
    reporter = TrialReporter.attach(cfg)  # None unless the run is an Optuna trial
    run_name, tags = "-".join(choices.values()), {**choices, "task": cfg.task.name}
    if (identifier := env_id(cfg.task)) is not None:
        tags["env_id"] = identifier
    if reporter is not None:
        run_name += f"-trial{cfg.trial.number}"
        tags.update({"optuna.study": cfg.trial.study_name, "optuna.trial": str(cfg.trial.number)})
    tracked_run = None
    if continued:  # the same tracked run as the attempt it continues
        tags["rlspeed.slurm_restarts"] = str(slurm.restarts())
        tracked_run = resumed[min(resumed)].get("tracked_run_id")
    elif resumed:
        tags["rlspeed.resumed_from"] = str(run_folder(str(cfg.resume)).resolve())
    if checked.initial is not None:
        tags["rlspeed.init_from"] = str(Path(str(cfg.init_from)).expanduser().resolve())
    tracker = TRACKERS.get(cfg.tracking.name).make(cfg.tracking, out_dir)
    params = flatten(cfg)
    tracker.start(run_name=run_name, params=params, tags=tags, run_id=tracked_run)
    monitor = RunMonitor(
        tracker,
        cfg.total_steps,
        cfg.eval_every,
        evaluate=lambda policy, index: task.evaluate(cfg.task, policy, cfg.seed + index),
        # A sweep's console shows one line per trial: a trial's progress goes to its log file.
        progress="none" if reporter is not None else cfg.progress,
        step_reward=task.step_reward,
        num_seeds=cfg.num_seeds,
    )
    if resumed:  # metrics continue from the saved step: the file written last has them all
        monitor.load_state_dict(resumed[_written_last(resumed)]["monitor"])
    videos = None
    if cfg.video_every > 0:  # the first seed's agent, on an env of its own
        filmed = partial(film_or_why, task, cfg.task, seed=cfg.seed)
        videos = VideoSchedule(cfg.video_every, out_dir / VIDEO_FOLDER, filmed, tracker)
    return Run(
        cfg=cfg,
        task=task,
        engine=engine,
        monitor=monitor,
        out_dir=out_dir,
        tracker=tracker,
        choices=choices,
        reporter=reporter,
        resumed=resumed,
        training_config=training_keys(params),
        resumable=checked.unresumable is None,
        videos=videos,
        initial=checked.initial,
    )


def _written_last(resumed: dict[int, dict[str, Any]]) -> int:
    """The seed whose resume file was written last, whose monitor state has every seed's
    rows: the one whose seeds had trained the most steps (seeds trained one after another:
    the last seed's; seed workers write every seed's together, one monitor state in all)."""

    def trained(index: int) -> tuple[int, int]:
        streams = resumed[index]["monitor"]["streams"]
        return sum(int(stream["steps"]) for stream in streams), index

    return max(resumed, key=trained)


# ---------------------------------------------------------------- the driver loops


def _train_host(run: Run) -> TrainResult:
    """Train the run's ``num_seeds`` agents from Python: in ``backend.seed_workers``
    processes at once where it is above 1, else one after another in this process."""
    cfg = run.cfg
    workers = cfg.backend.seed_workers
    assert isinstance(workers, int)  # resolved by the check: at most num_seeds
    if workers > 1 and multiprocessing.current_process().daemon:
        log.warning(
            "rlspeed: backend.seed_workers=%d: this run's process is a daemon process, which "
            "may not start processes; its seeds train one after another",
            workers,
        )
    elif workers > 1:
        run.seed_workers = workers
        return SeedWorkers(run, workers).train()
    steps = updates = 0
    for index in range(cfg.num_seeds):
        training = seed_training(
            cfg, run.task, run.engine, index, run.resumed.get(index), run.initial
        )
        if index == 0:  # asked once the backend has started (after the engine's workers)
            trains_on(run, [BACKENDS.get(cfg.backend.name).device_name(cfg.backend)])
        name = CHECKPOINT_FILES[cfg.backend.name]
        learner = training.learner
        set_agent_files(run, index, name, learner.agent_checkpoint, training.resume_state)
        schedule = _schedule(run, index, training.step)
        if run.videos is not None and index == 0:
            run.videos.start(training.step)
        try:
            _drive_host(run, index, training, schedule)
        except EnvFailed as failed:
            step, whole = training.step, training.whole
            raise env_failure(run, failed, step, whole, schedule.written) from None
        steps, updates = steps + training.step, updates + training.updates
        if cfg.checkpoint_every != 0 and index < cfg.num_seeds - 1:
            # The finished seed's files hold its whole run: resume= takes the metrics from
            # the last seed's file, which go on from there.
            write_now(run, index, training.step)
    return TrainResult(steps, updates)


def _drive_host(run: Run, index: int, training: HostTraining, schedule: CheckpointSchedule) -> None:
    """Record agent ``index``'s chunks as its ``HostTraining`` yields them."""
    monitor, task_cfg, seed = run.monitor, run.cfg.task, run.cfg.seed + index
    try:
        with deferred_interrupts() as check_interrupt, closing(training.chunks()) as chunks:
            for chunk in chunks:
                score = partial(run.task.evaluate, task_cfg, chunk.greedy, seed)
                record_chunk(run, index, chunk, score)
                training.accept()
                schedule.reached(chunk.step)
                if run.videos is not None and index == 0 and run.videos.due(chunk.step):
                    run.videos.record(chunk.step, chunk.greedy)
                monitor.moved(chunk.step, index)
                check_interrupt()
    except ResumeMismatch as error:
        allowed = f"a resume file whose state this run can take ({why(error.args[0])})"
        raise ConfigError("resume", run.cfg.resume, allowed) from None


def _train_fused(runs: list[Run]) -> list[TrainResult | Exception]:
    """Train ``runs`` (one run, or a sweep's trials that differ only in traced
    hyperparameters) as one program. A run whose record raises (its trial pruned, its loss
    not finite) ends there with that exception while the others train on; a lone run's
    exception propagates. Returns each run's result, or the exception it ended with; an
    interrupt ends them all."""
    from rlspeed.core.algos.loops.fused_training import FusedTraining

    first = runs[0]
    for started in runs:  # until the first chunk returns, the time goes to compiling
        started.monitor.compiling()
    make_train = import_named(ALGOS.get(first.cfg.algo.name).fused)
    from rlspeed.core.backends.flax import lane_devices

    resumed = first.resumed.get(0)
    devices = lane_devices(first.cfg.backend)
    training = FusedTraining(
        [r.cfg for r in runs], first.task, make_train, resumed, devices, first.initial
    )
    schedules = []
    for t, started in enumerate(runs):
        trains_on(started, training.devices)
        agents, resume_state = partial(training.agents, t), partial(training.resume_state, t)
        set_agent_files(started, 0, "checkpoint.msgpack", agents, resume_state)
        schedules.append(_schedule(started, 0, training.step))
        if started.videos is not None:
            started.videos.start(training.step)
    outcomes: list[TrainResult | Exception | None] = [None] * len(runs)
    every_seed = np.arange(first.cfg.num_seeds)
    with deferred_interrupts() as check_interrupt, closing(training.chunks()) as chunks:
        for chunk in chunks:
            for t, lane in chunk.runs.items():
                started = runs[t]
                monitor = started.monitor
                monitor.compiled_calls_s = (monitor.compiled_calls_s or 0.0) + chunk.seconds
                monitor.every_seed_episodes(lane.done, lane.episode_return, lane.episode_length)
                try:
                    check_finite(lane.metrics, every_seed, lane.steps, started.cfg.num_seeds)
                    logged = monitor.log_seeds(
                        every_seed, lane.steps, lane.updates, lane.metrics, lane.scores
                    )
                    report(started, logged)
                except Exception as error:  # noqa: BLE001 - this run's end, not the batch's
                    if len(runs) == 1:
                        raise
                    # Its checkpoint keeps the agents of its last recorded chunk, as a lone
                    # run's does when its record raises.
                    outcomes[t] = error
                    training.stop(t)
                    continue
                training.accept(t)
                schedules[t].reached(training.step)
                if started.videos is not None and started.videos.due(training.step):
                    started.videos.record(training.step, training.policies(t)[0])  # seed 0's
            check_interrupt()
    return [
        outcome if outcome is not None else training.result(t) for t, outcome in enumerate(outcomes)
    ]


def _schedule(run: Run, index: int, start_step: int) -> CheckpointSchedule:
    """When agent ``index``'s files are written while it trains, from env step
    ``start_step``."""
    cfg = run.cfg
    schedule = CheckpointSchedule(
        cfg.checkpoint_every, cfg.total_steps, partial(write_now, run, index)
    )
    schedule.start(start_step)
    return schedule


# ---------------------------------------------------------------- how a run ends


def _interrupted(stop: BaseException, out_dir: Path) -> None:
    log.warning("rlspeed: interrupted; saving a checkpoint and the metrics recorded so far")
    if isinstance(stop, Interrupted):
        stop.out_dir = out_dir


def _pruned(run: Run, pruned: BaseException) -> str:
    """Stopped by the study's pruner: the sweeper records the trial as PRUNED; the run
    ends KILLED."""
    run.pruned = True
    run.tracker.set_tags({"optuna.pruned": "true"})
    # The sweep's console has the trial's one line (PRUNED and why); its log file this one.
    to_log_file(f"rlspeed: trial {run.cfg.trial.number} {pruned}")
    return "KILLED"


def _finished(run: Run, result: TrainResult, unrecorded: Unrecorded | None) -> float:
    """A finished run's summary; its score, or the error saying what it could not record."""
    summary(run, result)
    if unrecorded and unrecorded.remote_only and run.cfg.trial.number is not None:
        # The trial's results are all in its folder and go to the study; the sweep says
        # at its end which trials the tracking store lost.
        log.warning(unrecorded.line)
    elif unrecorded:
        raise RLSpeedError(unrecorded.line)
    return run.monitor.score
