"""Trials on SLURM (``hydra/launcher=submitit_slurm``), each job's end its own.

hydra-submitit-launcher waits for a batch's jobs one after another and raises at the first
that ended without a result (cancelled, killed, out of memory, its node lost): the sweep
would stop, and the batch's other jobs, still running, would never be recorded. For its
launchers the sweeper launches a batch here instead: with the launcher's own settings and
job function, every job is waited for, and a lost one comes back as a FAILED job, so its
trial is recorded FAIL and the sweep goes on.

The jobs themselves are upstream's: on SIGUSR2 (SLURM's warning before a time limit or a
preemption) submitit calls the launcher's ``checkpoint`` and requeues the job; rlspeed saves
the run first and the requeued job continues it (rlspeed.slurm).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


def is_submitit(launcher: Launcher) -> bool:
    """Whether ``launcher`` is one of hydra-submitit-launcher's (SLURM or local)."""
    try:
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
    except ImportError:  # rlspeed installed without its cluster extra
        return False
    return isinstance(launcher, BaseSubmititLauncher)


def launch_each(
    launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """Submit one job per overrides list as one job array, as ``launcher.launch`` does, and
    return every job's return: a FAILED one for a job that ended without a result."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    params, kind = launcher.params, launcher._EXECUTOR
    # Upstream's mapping of its settings: folder and max_num_timeout when the executor is
    # made, the rest after (prefixed with the cluster's name unless every executor has it).
    executor = submitit.AutoExecutor(
        cluster=kind,
        folder=params["submitit_folder"],
        **{f"{kind}_max_num_timeout": params["max_num_timeout"]}
        if "max_num_timeout" in params
        else {},
    )
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(
        **{
            key if key in shared else f"{kind}_{key}": value
            for key, value in params.items()
            if key not in ("submitit_folder", "max_num_timeout")
        }
    )
    sweep = launcher.config.hydra.sweep
    sweep_dir = Path(str(sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in sweep:
        os.chmod(sweep_dir, mode=int(str(sweep.mode), 8))
    log.info("Submitit '%s' sweep output dir: %s", kind, sweep_dir)
    columns: list[list[Any]] = [[], [], [], [], []]  # the launcher's arguments, per job
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        arguments = (
            list(overrides),
            "hydra.sweep.dir",
            idx,
            f"job_id_for_{idx}",
            Singleton.get_state(),
        )
        for column, value in zip(columns, arguments, strict=True):
            column.append(value)
    # A worker that is itself a SLURM job must not pass its job's SLURM_* variables on: its
    # trial jobs would take its array id for theirs. The cluster's config file stays.
    slurm_conf = os.environ.get("SLURM_CONF")
    with submitit.helpers.clean_env():
        if slurm_conf is not None:
            os.environ["SLURM_CONF"] = slurm_conf
        jobs = executor.map_array(launcher, *columns)
    try:
        return [_wait(job, overrides) for job, overrides in zip(jobs, job_overrides, strict=True)]
    except KeyboardInterrupt:  # the sweep is stopped (Ctrl-C, SIGTERM): so are its jobs
        for job in jobs:
            job.cancel(check=False)
        raise


def _wait(job: Any, overrides: Sequence[str]) -> JobReturn:
    from submitit.core.utils import UncompletedJobError

    try:
        return job.results()[0]
    except UncompletedJobError:
        error = RuntimeError(
            f"SLURM job {job.job_id} ended without a result (state {job.state}); "
            f"its log: {job.paths.stderr}"
        )
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=error)
