"""Which study a sweep runs: its name (``hydra.sweeper.study_name``, else the ``hparams``
option's), its storage (``hydra.sweeper.storage``, else a journal under outputs/optuna/),
and the names of the metrics it optimizes, recorded in it.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rlspeed_optuna_sweeper._space import SweepConfigError
from rlspeed.errors import ConfigError
from rlspeed.sweep import MAX_NAME_CHARS, check_storage, normalize_storage


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


# A study's name is its journal's file name by default (default_storage): one file name, in
# outputs/optuna/ (no folder, no "..", not hidden), that any file system and shell take.
STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
STUDY_NAME_ALLOWED = (
    f"a name of 1 to {MAX_NAME_CHARS} letters, digits, '_', '-' and '.', not starting with "
    "'.' (the default storage is outputs/optuna/<study_name>.journal), or null (the hparams "
    "option's name)"
)


def study_name(config: DictConfig) -> str:
    """``hydra.sweeper.study_name``, or the default; raises ConfigError unless it is a
    file name that stays in outputs/optuna/."""
    name = config.hydra.sweeper.study_name
    if name is None:
        return default_study_name(config)
    if len(name) > MAX_NAME_CHARS or not STUDY_NAME.fullmatch(name):
        raise ConfigError("hydra.sweeper.study_name", name, STUDY_NAME_ALLOWED)
    return str(name)


def default_storage(name: str) -> str:
    """A journal file at a stable place under the working directory (sweep folders are
    timestamped), so the same command finds the same study."""
    return str(Path.cwd() / "outputs" / "optuna" / f"{name}.journal")


def sweep_storage(config: DictConfig) -> str:
    """The study's storage (``hydra.sweeper.storage`` or the default), as every process
    opens it (normalize_storage); raises ConfigError if trials cannot be recorded there."""
    spec = config.hydra.sweeper.storage or default_storage(study_name(config))
    check_storage(spec)
    return normalize_storage(spec)


def name_objectives(study: Any, objectives: list[str] | None, storage_spec: str) -> None:
    """Record the objectives' metric names in the study (its plots and table use them);
    a study resumed with other objectives would mix their values."""
    if study.metric_names is not None and study.metric_names != objectives:
        raise SweepConfigError(
            f"rlspeed: invalid hydra.sweeper.objectives={list_text(objectives)}: study "
            f"'{study.study_name}' in {storage_spec} optimizes "
            f"{list_text(study.metric_names)}; use another hydra.sweeper.study_name or storage"
        )
    if objectives is not None and study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(objectives)


def list_text(names: list[str] | None) -> str:
    return "null" if names is None else f"[{','.join(names)}]"
