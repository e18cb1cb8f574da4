"""How a trial's job ended, told to the study: COMPLETE with its objective values (the
numbers of its metrics.json that ``objectives`` names, else its return value), PRUNED when
the job raised ``optuna.TrialPruned``, FAIL otherwise; one console line each.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import optuna
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.rlspeed_optuna_sweeper._results import fmt_param, fmt_values
from hydra_plugins.rlspeed_optuna_sweeper._space import SweepSetup
from hydra_plugins.rlspeed_optuna_sweeper._study import list_text
from rlspeed.checkpoint import read_metrics
from rlspeed.sweep import study_value

log = logging.getLogger(__name__)


def record(
    study: Any, trial: Any, ret: JobReturn, setup: SweepSetup, unsent: dict[int, str]
) -> int:
    """Record how a job ended; returns 1 if the trial failed, else 0. ``unsent`` gets the
    trial's number where its run's records did not all reach the tracking store, and why."""
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
            unsent[trial.number] = errors[0]
    if ret.status == JobStatus.COMPLETED:
        values = _objective_values(
            ret.return_value, setup.objectives, output_dir, len(setup.directions)
        )
        if not isinstance(values, str):
            tell(study, trial, values=values)
            values_text = fmt_values(study, values)
            log.info("Trial %d: COMPLETE, %s | %s", trial.number, values_text, _params(trial))
            return 0
        reason = values
    else:
        error = ret._return_value  # the exception the job raised
        if isinstance(error, optuna.TrialPruned):
            tell(study, trial, state=TrialState.PRUNED)
            log.info("Trial %d: PRUNED, %s | %s", trial.number, error, _params(trial))
            return 0
        reason = " ".join(str(error).split()) or type(error).__name__
    tell(study, trial, state=TrialState.FAIL)
    log.warning("Trial %d: FAIL: %s | %s", trial.number, reason, _params(trial))
    return 1


def _params(trial: Any) -> str:
    """The trial's sampled values, on its one line of the sweep's console."""
    return ", ".join(f"{name}={fmt_param(value)}" for name, value in trial.params.items())


def _tracking_errors(output_dir: Path) -> list[str]:
    """Why a finished run did not record everything (its metrics.json ``errors``)."""
    try:
        return list(read_metrics(output_dir).get("errors") or [])
    except (OSError, ValueError, AttributeError):  # no metrics.json: the trial says why
        return []


def tell(study: Any, trial: Any, **kwargs: Any) -> None:
    """``study.tell(trial, **kwargs)``, past the error a grid sampler's last trial raises."""
    try:
        study.tell(trial, **kwargs)
    except RuntimeError as error:
        # A grid sampler stops the study when its grid is done, which only study.optimize()
        # allows; the trial is recorded all the same (and the sweep ends: _grid_exhausted).
        if "Study.stop" not in str(error):
            raise


def _objective_values(
    value: Any, objectives: list[str] | None, output_dir: str | None, n_objectives: int
) -> list[float] | str:
    """A finished job's objective values, rounded as studies record them (study_value):
    the numbers ``objectives`` names in its metrics.json, else its return value.
    Returns why there are none instead when they cannot be had."""
    if objectives is not None:
        try:
            metrics = read_metrics(Path(output_dir or "."))
        except (OSError, ValueError) as error:
            return f"no metrics.json in its folder {output_dir} ({error})"
        values: list[Any] = [metrics.get(name) for name in objectives]
        what = f"metrics.json's {list_text(objectives)} are {values}"
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
