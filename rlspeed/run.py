"""One training run: build the parts named by the config, train, record everything."""

from __future__ import annotations

import io
import json
import logging
import math
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from rlspeed import slurm
from rlspeed.algos.loops import train, train_runs
from rlspeed.checkpoint import atomic_write, run_folder, training_keys
from rlspeed.config import RunConfig, flatten, to_yaml
from rlspeed.context import OutputFile, RunContext, TrainResult
from rlspeed.errors import Interrupted, RLSpeedError, interrupt
from rlspeed.monitor import RECENT_EPISODES, RunMonitor, to_log_file
from rlspeed.registry import BACKENDS, ENGINES, TASKS, TRACKERS
from rlspeed.run_folders import load_resume
from rlspeed.sweep import TrialReporter
from rlspeed.tracking import Tracker, cause
from rlspeed.validation import validate

log = logging.getLogger("rlspeed")


def _output_dir() -> Path:
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def run(cfg: DictConfig) -> float:
    """Train as configured; returns the task's score (greedy evaluation)."""
    out_dir = _output_dir()
    # A requeued SLURM job continues the run its earlier attempt saved in this folder.
    continued = slurm.continued_folder(out_dir) if not cfg.resume else None
    if continued is not None:
        cfg.resume = str(continued)
        log.info(
            "rlspeed: SLURM job %s, attempt %d: continuing the run saved in %s",
            slurm.job_id(),
            slurm.restarts() + 1,
            continued,
        )
    validate(cfg)
    if cfg.mode == "eval":
        from rlspeed.evaluate import evaluate_checkpoint

        return evaluate_checkpoint(cfg)
    started = _start(cfg, out_dir, continued is not None)
    status, failure = "FAILED", None
    # A scheduler's SIGTERM (preemption, `timeout`), or SLURM's SIGUSR2, ends the run like
    # Ctrl-C: KILLED, checkpointed (and after SIGUSR2 the SLURM job is requeued).
    with slurm.StopSignals(interrupt):
        try:
            result = train(started.ctx)
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
            unrecorded = _end(started, status, failure)
            if unrecorded and status != "FINISHED":  # beside the error or interrupt on its way
                print(unrecorded.line, file=sys.stderr)
    return _finished(started, result, unrecorded)


def run_trials(cfgs: list[DictConfig], out_dirs: list[Path]) -> list[float | Exception]:
    """Train a sweep's trials on the fused path as one program (``train_runs``): configs
    that differ only in traced hyperparameters, each run in its own folder with all a
    lone run records. Returns each trial's score, or the exception it ended with (pruned,
    diverged, a config it cannot run); an interrupt ends them all, each saved as KILLED."""
    outcomes: list[float | Exception | None] = [None] * len(cfgs)
    started: dict[int, Started] = {}
    for index, (cfg, out_dir) in enumerate(zip(cfgs, out_dirs, strict=True)):
        try:
            validate(cfg)
            started[index] = _start(cfg, out_dir, continued=False)
        except Exception as error:  # noqa: BLE001 - this trial's failure, not the batch's
            outcomes[index] = error
    if not started:
        return [outcome for outcome in outcomes if outcome is not None]
    results: list[TrainResult | Exception] = []
    with slurm.StopSignals(interrupt):
        try:
            results = train_runs([run.ctx for run in started.values()])
        except KeyboardInterrupt as stop:  # every trial ends KILLED, as a lone run would
            _interrupted(stop, next(iter(started.values())).ctx.out_dir.parent)
            for run in started.values():
                _end(run, "KILLED")
            raise
        except Exception as error:  # noqa: BLE001 - the program failed: each of its trials
            results = [error] * len(started)
    endings = {}
    for (index, run), result in zip(started.items(), results, strict=True):
        status, failure = "FINISHED", None
        if isinstance(result, Exception):
            status = _pruned(run, result) if isinstance(result, run.pruned_error) else "FAILED"
            failure = str(result).removeprefix("rlspeed: ") if status == "FAILED" else None
        endings[index] = _ending(run, status, failure)
        next(endings[index])  # every trial's files first (_finishing)
    for (index, run), result in zip(started.items(), results, strict=True):
        unrecorded = next(endings[index])
        if isinstance(result, Exception):
            if unrecorded:
                log.warning(unrecorded.line)
            outcomes[index] = result
            continue
        try:
            outcomes[index] = _finished(run, result, unrecorded)
        except Exception as error:  # noqa: BLE001 - what this trial could not record
            outcomes[index] = error
    return [outcome for outcome in outcomes if outcome is not None]


class Started(NamedTuple):
    """A run set up to train: its context and what records it."""

    cfg: DictConfig
    ctx: RunContext
    tracker: Tracker
    # backend, env, algo, task: the run's stack, named in its summary.
    choices: dict[str, str]
    # optuna.TrialPruned for a trial run; () matches nothing, so other runs never import
    # optuna.
    pruned_error: Any


def _start(cfg: DictConfig, out_dir: Path, continued: bool) -> Started:
    """Set up a validated run: its folder and config file, its tracked run, its monitor
    and context."""
    resumed = load_resume(cfg) if cfg.resume else {}  # as validate read it: nothing new
    task, engine = TASKS.get(cfg.task.name), ENGINES.get(cfg.env.name)
    BACKENDS.get(cfg.backend.name).setup(cfg.backend, cfg.seed)

    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        _write_text(out_dir / "config.yaml", to_yaml(cfg))
    except OSError as error:
        raise RLSpeedError(
            f"rlspeed: could not write config.yaml in {out_dir}: {cause(error)}"
        ) from None
    choices = {
        "backend": cfg.backend.name,
        "env": cfg.env.name,
        "algo": cfg.algo.name,
        "task": cfg.task.name,
    }
    reporter = TrialReporter.attach(cfg)  # None unless the run is an Optuna trial
    run_name, tags = "-".join(choices.values()), dict(choices)
    if reporter is not None:
        run_name += f"-trial{cfg.trial.number}"
        tags.update({"optuna.study": cfg.trial.study_name, "optuna.trial": str(cfg.trial.number)})
    tracked_run = None
    if continued:  # the same tracked run as the attempt it continues
        tags["rlspeed.slurm_restarts"] = str(slurm.restarts())
        tracked_run = resumed[min(resumed)].get("tracked_run_id")
    elif resumed:
        tags["rlspeed.resumed_from"] = str(run_folder(cfg.resume).resolve())
    tracker = TRACKERS.get(cfg.tracking.name).make(cfg.tracking, out_dir)
    tracker.start(run_name=run_name, params=flatten(cfg), tags=tags, run_id=tracked_run)
    # The training loops read the config on every step: as the schema's dataclasses an
    # attribute costs ~30 ns, through DictConfig ~10 us (18% of a CartPole DQN run).
    plain_cfg = OmegaConf.to_object(cfg)
    assert isinstance(plain_cfg, RunConfig)  # the schema rlspeed's config is built on
    monitor = RunMonitor(
        tracker,
        cfg.total_steps,
        cfg.eval_every,
        evaluate=lambda policy, index: task.evaluate(
            plain_cfg.task, policy, plain_cfg.seed + index
        ),
        # A sweep's console shows one line per trial: a trial's progress goes to its log file.
        progress="none" if reporter is not None else cfg.progress,
        step_reward=task.step_reward,
        num_seeds=cfg.num_seeds,
    )
    if resumed:  # metrics continue from the saved step: the last seed's file has them all
        # (seeds train in order, each one's files written before the next starts: each_seed)
        monitor.load_state_dict(resumed[max(resumed)]["monitor"])
    ctx = RunContext(
        plain_cfg,
        task,
        engine,
        monitor,
        out_dir,
        resumed=resumed,
        tracker=tracker,
        training_config=training_keys(flatten(cfg)),
        report_score=reporter.report if reporter is not None else None,
        resumable=engine.needs_functional_env or _env_state_saved(cfg),
    )
    pruned_error = reporter.pruned_error if reporter is not None else ()
    return Started(cfg, ctx, tracker, choices, pruned_error)


def _env_state_saved(cfg: DictConfig) -> bool:
    from rlspeed.engines.env_state import saves_state  # Gymnasium's: loaded for its engine

    return saves_state(cfg.task)


def _interrupted(stop: BaseException, out_dir: Path) -> None:
    log.warning("rlspeed: interrupted; saving a checkpoint and the metrics recorded so far")
    if isinstance(stop, Interrupted):
        stop.out_dir = out_dir


def _pruned(started: Started, pruned: BaseException) -> str:
    """Stopped by the study's pruner: the sweeper records the trial as PRUNED; the run
    ends KILLED."""
    started.tracker.set_tags({"optuna.pruned": "true"})
    # The sweep's console has the trial's one line (PRUNED and why); its log file this one.
    to_log_file(f"rlspeed: trial {started.cfg.trial.number} {pruned}")
    return "KILLED"


def _end(started: Started, status: str, failure: str | None = None) -> Unrecorded | None:
    """Save the outputs and end the tracked run (``failure``: why it failed); what could not
    be recorded, or None."""
    ending = _ending(started, status, failure)
    next(ending)
    return next(ending)


def _ending(
    started: Started, status: str, failure: str | None = None
) -> Iterator[Unrecorded | None]:
    """``_finishing``'s two steps in the monitor's saving phase; the monitor is closed
    before the second step yields (the summary comes after it)."""
    monitor = started.ctx.run_monitor
    monitor.saving()
    finishing = _finishing(started.tracker, started.ctx, status, failure)
    try:
        yield next(finishing)
        unrecorded = next(finishing)
    finally:
        monitor.close()
    yield unrecorded


def _finished(started: Started, result: TrainResult, unrecorded: Unrecorded | None) -> float:
    """A finished run's summary; its score, or the error saying what it could not record."""
    ctx = started.ctx
    _summary(started.choices, result, started.tracker, ctx)
    if unrecorded and unrecorded.remote_only and ctx.cfg.trial.number is not None:
        # The trial's results are all in its folder and go to the study; the sweep says
        # at its end which trials the tracking store lost.
        log.warning(unrecorded.line)
    elif unrecorded:
        raise RLSpeedError(unrecorded.line)
    return ctx.run_monitor.score


class Unrecorded(NamedTuple):
    """What a run could not record: one line saying what, where and why."""

    line: str
    # Every file is in the run folder; only the tracking store lacks records.
    remote_only: bool


def _finishing(
    tracker: Tracker, ctx: RunContext, status: str, failure: str | None
) -> Iterator[Unrecorded | None]:
    """Save the run's outputs and close the tracked run, however training ended, in two
    steps: the first writes every file and queues its upload (yields None); the second
    waits for the tracking store, writes metrics.json, ends the tracked run and yields what
    could not be recorded (the run is then FAILED where it would have FINISHED; a sweep's
    trial that lost only its tracking store's copy stays FINISHED), or None. A batch of
    trials takes every trial's first step before any second step (``run_trials``): the
    trials' tracking writers upload while the next trial's files are drawn.

    Each file is written on its own (atomically), so one that cannot be written, on a full
    disk say, costs only itself. ``failure``, why training failed, comes first in
    metrics.json's ``errors``."""
    out_dir, monitor = ctx.out_dir, ctx.run_monitor
    failed: dict[str, list[str]] = {}  # why -> the files that could not be written

    def save(output: OutputFile) -> bool:
        try:
            output.write(output.path)
        except Exception as error:  # costs this file alone; reported in the returned line
            failed.setdefault(cause(error), []).append(output.path.name)
            return False
        return True

    def write(output: OutputFile) -> None:
        if save(output) and output.artifact:
            tracker.log_artifact(output.path)

    def problems() -> list[str]:
        lines = [
            f"could not write {', '.join(names)} in {out_dir}: {why}"
            for why, names in failed.items()
        ]
        if tracker.failure is not None:
            lines.append(
                f"{tracker.failure}, so the run is not fully recorded there; "
                f"its outputs are in {out_dir}"
            )
        return lines

    def final_status() -> str:
        lost = failed or (tracker.failure is not None and ctx.cfg.trial.number is None)
        return "FAILED" if status == "FINISHED" and lost else status

    final = status
    try:
        # Every agent's files on disk first, uploads after: a preempted job has seconds before
        # SLURM kills it, and its requeued attempt continues from these files.
        outputs = [output for files in ctx.checkpointers.values() for output in files]
        trial = ctx.cfg.trial
        if status == "FINISHED" and trial.number is not None and not trial.keep_resume:
            # A finished trial keeps its agent and metrics; its resume state (the replay
            # buffer) could only continue a run that has nothing left to do. A periodic
            # checkpoint may have written it already.
            for output in outputs:
                if output.resume_state:
                    output.path.unlink(missing_ok=True)
            outputs = [output for output in outputs if not output.resume_state]
        saved = [output for output in outputs if save(output)]
        tracker.log_artifact(out_dir / "config.yaml")
        for output in saved:
            if output.artifact:
                tracker.log_artifact(output.path)
        if _curves(monitor):
            write(OutputFile(out_dir / "learning_curve.png", partial(_plot_curve, ctx)))
        yield None
        # Written last: its status and errors cover the files above and every metric row
        # (the tracker has written all it was given, or says why not).
        tracker.flush()
        errors = [failure, *problems()] if failure else problems()
        metrics = partial(
            _write_metrics, monitor, status=final_status(), errors=errors, run_id=tracker.run_id
        )
        write(OutputFile(out_dir / "metrics.json", metrics))
        final = final_status()
    finally:
        tracker.end(final)
    lines = problems()  # ending the tracked run may have failed too
    yield Unrecorded("rlspeed: " + "; ".join(lines), not failed) if lines else None


def _write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda file: file.write(text.encode()))


def _write_metrics(
    monitor: RunMonitor, path: Path, status: str, errors: list[str], run_id: str | None
) -> Path:
    summary = {
        "status": status,
        # Why the run is not fully recorded (a full disk, a dead tracking server); [] if it is.
        "errors": errors,
        "mlflow_run_id": run_id,
        "num_seeds": monitor.num_seeds,
        # Means over seeds where num_seeds > 1; per-seed values under "seeds".
        "score": monitor.score,
        "rolling_step_reward": monitor.rolling_step_reward,
        "recent_return": monitor.recent_return,
        # Summed over seeds: agent-steps and updates of all agents together.
        "env_steps": monitor.steps,
        "gradient_updates": monitor.updates,
        "wall_time_s": monitor.wall_time,
        "env_steps_per_s": monitor.steps / monitor.wall_time,
        "updates_per_s": monitor.updates / monitor.wall_time,
        # Fused path: of wall_time_s, the seconds in the compiled chunk calls (null elsewhere).
        "compiled_calls_s": monitor.compiled_calls_s,
        # The last logged row (None if the run stopped before its first log).
        "final": monitor.history[-1] if monitor.history else None,
        # Every logged row, as the tracker got it (MLflow: each metric's history).
        "history": monitor.history,
    }
    if monitor.num_seeds > 1:
        summary["seeds"] = [
            {
                **seed,
                "final": rows[-1] if rows else None,
                # Logged to the tracker as seed<i>/<name>.
                "history": rows,
            }
            for seed, rows in zip(monitor.seed_summaries(), monitor.seed_history, strict=True)
        ]
    return _write_text(path, json.dumps(json_safe(summary), indent=2, allow_nan=False))


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite as None: metrics.json is strict JSON
    (a run stopped before its first evaluation has no score: null, not NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _curves(monitor: RunMonitor) -> list[tuple[str, list[dict[str, float]]]]:
    """(label suffix, rows) of each curve to plot: the rows of every seed together (means
    where num_seeds > 1); else, for a multi-seed run stopped before every seed logged a step,
    each seed's own rows."""
    if monitor.history:
        return [("", monitor.history)]
    return [(f", seed {i}", rows) for i, rows in enumerate(monitor.seed_history) if rows]


def _plot_curve(ctx: RunContext, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monitor = ctx.run_monitor
    mean = monitor.num_seeds > 1 and bool(monitor.history)
    returns = ("charts/episodic_return", "episodic return (training)")
    score = ("eval/score", "score (greedy evaluation)")
    step_reward = ("charts/rolling_step_reward", "rolling step reward (training)")
    # One panel per scale: Doors' score is a step reward ratio, other tasks' a mean return.
    panels = [[returns], [step_reward, score]] if ctx.task.step_reward else [[returns, score]]
    # Only panels with something logged (a run stopped early may have no evaluation yet).
    logged = {name for _, curve in _curves(monitor) for row in curve for name in row}
    panels = [panel for panel in panels if logged & {name for name, _ in panel}] or panels[:1]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for name, label in panel:
            for suffix, curve in _curves(monitor):
                rows = [row for row in curve if name in row]
                if rows:
                    steps = np.array([row["step"] for row in rows])
                    values = np.array([row[name] for row in rows])
                    marker = "o" if name == "eval/score" else None
                    ax.plot(steps, values, marker=marker, label=label + suffix)
                    if mean:
                        spread = np.array([row[f"{name}_std"] for row in rows])
                        ax.fill_between(steps, values - spread, values + spread, alpha=0.2)
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
        ax.legend()
    if mean:
        fig.suptitle(f"learning curve (mean ± std over {monitor.num_seeds} seeds)")
    elif monitor.num_seeds > 1:
        fig.suptitle(f"learning curve (stopped before all {monitor.num_seeds} seeds logged)")
    else:
        fig.suptitle("learning curve")
    fig.tight_layout()
    try:
        return atomic_write(path, lambda file: fig.savefig(file, format="png", dpi=100))
    finally:
        plt.close(fig)


def _summary(
    choices: dict[str, str], result: TrainResult, tracker: Tracker, ctx: RunContext
) -> None:
    """The run's numbers as a table, then where its outputs are as plain lines (a terminal
    wraps a long path, rich would cut it to the width); the log file gets both."""
    monitor = ctx.run_monitor
    table = Table(title="rlspeed run", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for key, value in choices.items():
        table.add_row(key, value)
    backend = ctx.cfg.backend
    table.add_row("device", BACKENDS.get(backend.name).device_name(backend))
    wall = monitor.wall_time
    seeds = f" (mean of {monitor.num_seeds} seeds)" if monitor.num_seeds > 1 else ""
    rows = [
        ("seeds", str(monitor.num_seeds)),
        ("env steps", f"{result.steps:,}"),
        ("gradient updates", f"{result.updates:,}"),
        ("wall time", f"{wall:.1f} s"),
        ("env steps/s", f"{result.steps / wall:,.0f}"),
        ("updates/s", f"{result.updates / wall:,.0f}"),
        (f"score{seeds}", f"{monitor.score:.4f}"),
    ]
    if ctx.task.step_reward:
        rows.append(("rolling step reward", f"{monitor.rolling_step_reward:.4f}"))
    rows.append((f"return, last {RECENT_EPISODES} episodes", f"{monitor.recent_return:.2f}"))
    for key, value in rows:
        table.add_row(key, value)
    where = [("outputs", str(ctx.out_dir.resolve()))]
    for files in ctx.checkpointers.values():
        # The agent's checkpoint (the MLflow artifact), not the resume state beside it.
        where += [("checkpoint", str(f.path.resolve())) for f in files if f.artifact]
    if tracker.run_id is not None:
        where.append(("MLflow run id", tracker.run_id))
    where += tracker.links().items()
    width = max(len(key) for key, _ in where)
    lines = "\n".join(f"{key:<{width}}  {value}" for key, value in where)
    # A sweep's trial keeps its summary in its log file; the sweep prints one line for it.
    trial = ctx.cfg.trial.number is not None
    console = Console(record=True, file=io.StringIO() if trial else None)
    console.print(table)
    if not trial:
        print(lines, flush=True)
    to_log_file("\n" + console.export_text() + lines)
