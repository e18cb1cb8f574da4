"""Batched trials: on the fused path (``backend=flax env=jax-vmap``) a sweep's trials that
differ only in traced hyperparameters (each algorithm config's ``TRACED``) train as lanes
of one compiled program, in the sweep's process (``rlspeed.run.run_trials``).

The sweeper asks for ``hydra.sweeper.batch_size`` trials at once; here each gets its Hydra
job config and folder as the basic launcher would give it (``.hydra/`` with its config and
overrides), the trials are grouped by static signature (every other config value: each
distinct value of a shape-changing parameter makes a group of its own), and each group is
one program, or as few as fit in this machine's memory. Every trial ends with a
``JobReturn`` the sweeper records as any job's.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# Hydra's own naming of a job's folder after its overrides (hydra.job.override_dirname).
from hydra._internal.config_loader_impl import get_overrides_dirname
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rlspeed.config import FUSED_STACK
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS, TASKS

log = logging.getLogger(__name__)


def batches_trials(config: DictConfig, launcher: Any, batch_size: int) -> bool:
    """Whether this sweep trains its trials in batches: rlspeed trials on the fused path,
    ``batch_size`` > 1, in this process (the basic launcher; joblib and SLURM launchers
    run one trial per job)."""
    return (
        batch_size > 1
        and "trial" in config
        and (config.backend.name, config.env.name) == FUSED_STACK
        and type(launcher).__name__ == "BasicLauncher"
    )


def static_signature(task_cfg: DictConfig) -> str:
    """The trial's config without its traced values (the algorithm's hyperparameters, the
    task's settings such as gymnax env params) and its trial number: trials with the same
    signature can share one program."""
    plain = OmegaConf.to_container(task_cfg, resolve=True)
    assert isinstance(plain, dict)
    traced = ALGOS.get(task_cfg.algo.name).schema.TRACED
    plain["algo"] = {key: value for key, value in plain["algo"].items() if key not in traced}
    for name in _traced_settings(task_cfg.task):
        *parents, key = name.split(".")
        node = plain["task"]
        for parent in parents:
            node = node[parent]
        node.pop(key)
    plain.pop("trial", None)
    return json.dumps(plain, sort_keys=True, default=str)


def _traced_settings(task_cfg: DictConfig) -> list[str]:
    """The task's traced settings (``TaskSpec.traced``), by dotted name; none where the
    settings cannot be read (the trial then fails on its own, in a group of its own)."""
    try:
        return list(TASKS.get(task_cfg.name).traced(OmegaConf.to_object(task_cfg)))
    except ConfigError:
        return []


def launch_batched(
    hydra_context: HydraContext, config: DictConfig, batch: Sequence[list[str]], job_idx: int
) -> list[JobReturn]:
    """Run the jobs ``batch`` (each trial's overrides), grouped into programs; their
    returns in order."""
    from rlspeed.run import run_trials

    jobs = _jobs(hydra_context, config, [list(overrides) for overrides in batch], job_idx)
    cfgs: dict[int, DictConfig] = {}
    out_dirs: dict[int, Path] = {}
    groups: dict[str, list[int]] = {}
    for index, ret in enumerate(jobs):
        if ret.status == JobStatus.FAILED:  # its overrides could not be composed
            continue
        assert ret.cfg is not None and ret.hydra_cfg is not None
        cfgs[index] = ret.cfg
        out_dirs[index] = Path(ret.hydra_cfg.hydra.runtime.output_dir)
        groups.setdefault(static_signature(ret.cfg), []).append(index)
    for group in groups.values():
        for part in _fitting(group, cfgs[group[0]]):
            log.info(
                "Trial(s) %s: one program of %d lane(s)",
                ", ".join(str(cfgs[i].trial.number) for i in part),
                len(part) * cfgs[part[0]].num_seeds,
            )
            with _batch_log(out_dirs[part[0]].parent, [cfgs[i].trial.number for i in part]):
                outcomes = run_trials([cfgs[i] for i in part], [out_dirs[i] for i in part])
            for i, outcome in zip(part, outcomes, strict=True):
                failed = isinstance(outcome, Exception)
                jobs[i].status = JobStatus.FAILED if failed else JobStatus.COMPLETED
                jobs[i].return_value = outcome
    return jobs


@contextlib.contextmanager
def _batch_log(sweep_dir: Path, numbers: list[int]) -> Iterator[None]:
    """The batch's log lines (its trials', together) in ``batch_<first>-<last>.log`` in the
    sweep folder, as a lone trial's go to its folder's ``rlspeed.log``."""
    handler = logging.FileHandler(sweep_dir / f"batch_{numbers[0]}-{numbers[-1]}.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def _fitting(group: list[int], cfg: DictConfig) -> list[list[int]]:
    """``group`` split into as few parts of equal size as fit in memory: a program holds
    every lane's state, a share on each device its lanes spread over (``check_memory`` of
    the run with that many seeds, counted per GPU; forced CPU devices share one memory)."""
    from rlspeed.core.backends.flax import lane_devices
    from rlspeed.validation import check

    try:
        devices = lane_devices(check(cfg).cfg.backend)
    except ConfigError:  # each trial fails on its own, with its own line
        return [[index] for index in group]
    memories = len(devices) if devices[0].platform != "cpu" else 1
    size = len(group)
    while size > 1:
        lanes = copy.deepcopy(cfg)
        lanes.num_seeds = cfg.num_seeds * size
        lanes.backend.devices = memories
        try:
            check(lanes)
            break
        except ConfigError:
            size = (size + 1) // 2
    parts = math.ceil(len(group) / size)
    size = math.ceil(len(group) / parts)  # as even as the parts can be: every device as full
    return [group[i : i + size] for i in range(0, len(group), size)]


def _jobs(
    hydra_context: HydraContext, config: DictConfig, batch: list[list[str]], job_idx: int
) -> list[JobReturn]:
    """The trials' jobs (``_job``). Hydra composes a config in ~0.3 s, as long as a short
    trial trains: trials whose overrides change only values of the first one's config get
    a copy of it with those values (``_derived``), the others are composed."""
    base: tuple[list[str], DictConfig] | None = None
    jobs = []
    for index, overrides in enumerate(batch):
        sweep_config = _derived(*base, overrides) if base is not None else None
        if sweep_config is None:
            try:
                sweep_config = hydra_context.config_loader.load_sweep_config(config, overrides)
            except Exception as error:  # noqa: BLE001 - this trial's failure, recorded as FAIL
                failed = JobReturn(overrides=overrides, status=JobStatus.FAILED)
                failed.return_value = error
                jobs.append(failed)
                continue
            base = (overrides, copy.deepcopy(sweep_config))
        jobs.append(_job(sweep_config, overrides, job_idx + index))
    return jobs


def _derived(
    base_overrides: list[str], base: DictConfig, overrides: list[str]
) -> DictConfig | None:
    """The sweep config ``overrides`` compose to, from ``base`` (what ``base_overrides``
    composed to) with the values they change; None where one changes anything but a
    value the base config has (a config group, an added or deleted key)."""
    if len(overrides) != len(base_overrides):
        return None
    changes = [(a, b) for a, b in zip(base_overrides, overrides, strict=True) if a != b]
    parser = OverridesParser.create()
    try:
        before = parser.parse_overrides([a for a, _ in changes])
        after = parser.parse_overrides([b for _, b in changes])
    except HydraException:
        return None
    derived = copy.deepcopy(base)
    for old, new in zip(before, after, strict=True):
        key = new.key_or_group
        if (
            key != old.key_or_group
            or new.type != OverrideType.CHANGE
            or new.package is not None
            or key.startswith("hydra.")
            or isinstance(OmegaConf.select(derived, key), DictConfig)  # a config group
            or OmegaConf.select(derived, key, default=_ABSENT) is _ABSENT
        ):
            return None
        OmegaConf.update(derived, key, new.value(), merge=False)
    replaced = dict(changes)
    task = [replaced.get(o, o) for o in base.hydra.overrides.task]
    names = derived.hydra.job.config.override_dirname
    with read_write(derived.hydra):
        derived.hydra.overrides.task = task
        derived.hydra.job.override_dirname = get_overrides_dirname(
            overrides=parser.parse_overrides(task),
            kv_sep=names.kv_sep,
            item_sep=names.item_sep,
            exclude_keys=names.exclude_keys,
        )
    return derived


_ABSENT = object()


def _job(sweep_config: DictConfig, overrides: list[str], idx: int) -> JobReturn:
    """Trial job ``idx`` of its composed config: its folder, as Hydra's basic launcher and
    ``run_job`` make it (its ``.hydra/`` files included); its status is still unknown."""
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = idx
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)  # the sweep subdir reads hydra.job
    output_dir = os.path.abspath(
        os.path.join(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir))
    )
    with read_write(sweep_config.hydra.runtime), open_dict(sweep_config.hydra.runtime):
        sweep_config.hydra.runtime.output_dir = output_dir
    HydraConfig.instance().set_config(sweep_config)
    task_cfg = copy.deepcopy(sweep_config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    hydra_cfg = copy.deepcopy(HydraConfig.instance().cfg)
    assert isinstance(hydra_cfg, DictConfig)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    if sweep_config.hydra.output_subdir is not None:
        saved = Path(output_dir) / str(sweep_config.hydra.output_subdir)
        saved.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(task_cfg, saved / "config.yaml")
        OmegaConf.save(hydra_cfg, saved / "hydra.yaml")
        OmegaConf.save(sweep_config.hydra.overrides.task, saved / "overrides.yaml")
    return JobReturn(
        overrides=overrides, cfg=task_cfg, hydra_cfg=hydra_cfg, working_dir=os.getcwd()
    )
