"""Typed schemas of the config tree, and what reads a config without judging it: its YAML,
its flat keys, which path it trains on; and the probes the checks use (can a folder be
created, does a database answer). The checks themselves: ``rlspeed.validation``."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS, TASKS
from rlspeed.secrets import mask, mask_value, reveal


@dataclass
class BackendConfig:
    name: str = MISSING
    # Deterministic kernels and seeded RNGs, so the same seed gives the same run.
    deterministic: bool = True
    # CPU threads for the backend's math: an integer (0: the library's default, one per
    # core), or auto: picked from the run's sizes before the backend starts (``auto_threads``).
    threads: int | str = "auto"
    # Where the agent's arrays live: auto (a GPU when the backend's library sees one, else
    # the CPU), cpu, cuda or cuda:N. torch: its tensors (environments stay where the engine
    # keeps them; arrays cross through DLPack). flax: JAX's platform (cpu keeps JAX off a GPU).
    device: str = "auto"
    # backend=flax: the folder where compiled XLA programs are kept between runs (JAX's
    # persistent compilation cache); None compiles every program in every run.
    compilation_cache: str | None = None


@dataclass
class EngineConfig:
    name: str = MISSING
    # AsyncVectorEnv only: observations travel through shared memory.
    shared_memory: bool = True
    # AsyncVectorEnv only: seconds a step of the envs may take before the run takes an env
    # that has not answered to hang, and ends in one line naming it.
    step_timeout_s: float = 600.0


@dataclass
class TrackingConfig:
    name: str = MISSING
    # MLflow tracking URI; None means MLFLOW_TRACKING_URI or MLflow's default local store.
    uri: str | None = None
    experiment: str = "rlspeed"
    # MLflow run to nest this run under (an Optuna study's parent run); set by the sweeper.
    parent_run_id: str | None = None
    # tracking=tensorboard: the folder of the event files; None: <run folder>/tensorboard.
    log_dir: str | None = None


@dataclass
class TaskConfig:
    """Fields every task has; each task's schema extends it."""

    name: str = MISSING
    # Training episode length (time-limit truncation).
    max_steps: int = MISSING


@dataclass
class TrialConfig:
    """The Optuna trial a run belongs to; set only by the Optuna sweeper, per job."""

    # Where the study lives (a journal file path or a database URL).
    storage: str | None = None
    study_name: str | None = None
    number: int | None = None
    # Whether the trial keeps its resume state once it has finished (the sweeper's
    # keep_resume): only an interrupted run continues from it.
    keep_resume: bool = False


@dataclass
class RunConfig:
    backend: BackendConfig = field(default_factory=BackendConfig)
    env: EngineConfig = field(default_factory=EngineConfig)
    algo: Any = MISSING
    task: Any = MISSING
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)
    seed: int = 1
    # Independent agents trained in one run, with seeds seed, seed+1, ...: one vmap-ed
    # program on the fused path, one after another elsewhere.
    num_seeds: int = 1
    # Parallel copies of the task; each engine option sets its own default.
    num_envs: int = MISSING
    total_steps: int = 300_000
    # Env steps between metric logs (and between returns to Python on the fused path).
    log_every: int = 10_000
    # Env steps between greedy evaluations (eval/score).
    eval_every: int = 50_000
    # Env steps between checkpoints written while the run trains (the agent and resume.npz,
    # so that a run killed outright loses at most this many); 0: only at the end or on a
    # signal; auto: every 30 s of training or more, at most 2% of the time (README).
    checkpoint_every: int | str = "auto"
    # auto: rich progress on a terminal, plain log lines otherwise.
    progress: str = "auto"
    # train, or eval: score the agent saved at ``checkpoint`` (and film one episode to ``video``).
    mode: str = "train"
    # A run folder (or a file in one) to continue from, with this run's settings.
    resume: str | None = None
    checkpoint: str | None = None
    video: str | None = None


# The run's config: its schema's dataclasses while it trains (``RunContext.cfg``), a
# DictConfig of that schema while it is checked or read back from a run folder.
RunConfigLike: TypeAlias = RunConfig | DictConfig
# A task's settings, likewise (``RunConfig.task``; each task's schema extends TaskConfig).
TaskConfigLike: TypeAlias = TaskConfig | DictConfig


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore; YAML options build on them."""
    store = ConfigStore.instance()
    store.store(name="rlspeed_schema", node=RunConfig)
    for registry in (ALGOS, TASKS):
        for spec in registry.builtins():
            store.store(group=f"schema/{registry.group}", name=spec.name, node=spec.schema)


def is_fused(cfg: RunConfigLike) -> bool:
    """Whether the run is one fused program (flax on the functional jax-vmap engine)."""
    return cfg.backend.name == "flax" and cfg.env.name == "jax-vmap"


# Env steps are counted in int32 on the fused path (at most 2,147,483,647); this leaves
# room for the round-up to whole iterations.
MAX_STEPS = 2_000_000_000
# The longest evaluation episode (task=gym: an id's registered max_episode_steps, or its
# task.max_steps where it registers none): a score waits for all its episodes to end, one
# batched policy call per step. Standard limits are far shorter (MuJoCo's 1,000).
MAX_EPISODE_STEPS = 100_000
# Seeds of one run: on the fused path lanes of one program (rlspeed-bench qlearn runs 1,024
# Q-learning agents), elsewhere trainings one after another; each has its own metrics
# (seed<i>/<name>) and rows in metrics.json. The memory checks count what each holds.
MAX_SEEDS = 65_536


def quote(text: str) -> str:
    """``text`` as a quoted string of Hydra's override grammar (``key='...'``): taken as
    it is, whatever characters it holds."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def to_yaml(cfg: DictConfig) -> str:
    """The run's config.yaml, passwords in URLs masked."""
    return mask(OmegaConf.to_yaml(cfg, resolve=True))


def flatten(cfg: DictConfig) -> dict[str, Any]:
    """Dotted keys to leaf values, as MLflow params; passwords in URLs masked, as in the
    saved config.yaml this is compared with (resume=)."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = mask_value(node)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


# Bytes of one file or folder name on Linux's file systems.
NAME_MAX = 255


def uncreatable(folder: Path) -> tuple[Path, str] | None:
    """(where, why) when nothing can be created in ``folder`` or, where it does not exist
    yet, in its nearest existing ancestor; None when something can.

    Creates nothing that stays: it makes and removes a scratch folder there, which also tests
    what permission bits cannot (``root`` passes every ``os.access`` check, yet cannot create
    anything in /proc or on a read-only mount).
    """
    existing = folder.expanduser().absolute()
    for part in existing.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return existing, f"a name of {len(os.fsencode(part)):,} bytes, more than {NAME_MAX}"
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlspeed-check-", dir=existing))
    except OSError as error:  # not a folder, read-only, no permission
        return existing, error.strerror or type(error).__name__
    return None


def unreachable(database_url: str, timeout_s: int = 5) -> str | None:
    """Why a database server (PostgreSQL, MySQL) cannot be connected to, in one line; None
    when it answers. Creates nothing."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    url = reveal(database_url)
    engine = create_engine(url, connect_args={"connect_timeout": timeout_s})
    try:
        with engine.connect():
            return None
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", None) or error).strip()
        return (reason.splitlines() or [type(error).__name__])[0][:200]
    finally:
        engine.dispose()


def check_creatable(key: str, value: object, folder: Path, allowed: str) -> None:
    """Raise ConfigError unless ``folder`` exists and takes new files, or can be created."""
    problem = uncreatable(folder)
    if problem is not None:
        where, why = problem
        raise ConfigError(key, value, f"{allowed} ({where}: {why})")
