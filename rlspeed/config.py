"""Typed schemas of the config tree and the checks that run before any work starts."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from rlspeed.errors import ConfigError, StoreUnreachable
from rlspeed.registry import ALGOS, BACKENDS, ENGINES, TASKS, TRACKERS
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


@dataclass
class TrackingConfig:
    name: str = MISSING
    # MLflow tracking URI; None means MLFLOW_TRACKING_URI or MLflow's default local store.
    uri: str | None = None
    experiment: str = "rlspeed"
    # MLflow run to nest this run under (an Optuna study's parent run); set by the sweeper.
    parent_run_id: str | None = None


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


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore; YAML options build on them."""
    store = ConfigStore.instance()
    store.store(name="rlspeed_schema", node=RunConfig)
    for registry in (ALGOS, TASKS):
        for spec in registry:
            store.store(group=f"schema/{registry.group}", name=spec.name, node=spec.schema)


# Env steps are counted in int32 on the fused path (at most 2,147,483,647); this leaves
# room for the round-up to whole iterations.
MAX_STEPS = 2_000_000_000


def validate(cfg: DictConfig) -> None:
    """Reject bad or incompatible values with one clear line before any work starts."""
    for key in ("num_envs", "num_seeds"):
        if cfg[key] < 1:
            raise ConfigError(key, cfg[key], "an integer >= 1")
    for key in ("total_steps", "log_every", "eval_every"):
        if not 1 <= cfg[key] <= MAX_STEPS:
            raise ConfigError(key, cfg[key], f"an integer in [1, {MAX_STEPS:,}]")
    every = cfg.checkpoint_every
    if every != "auto" and (isinstance(every, str) or not 0 <= every <= MAX_STEPS):
        allowed = f"auto, 0 (off) or an integer in [1, {MAX_STEPS:,}] (env steps)"
        raise ConfigError("checkpoint_every", every, allowed)
    if cfg.seed < 0:
        raise ConfigError("seed", cfg.seed, "an integer >= 0")
    if cfg.total_steps < cfg.num_envs:  # one step of every env is the least a run does
        raise ConfigError("total_steps", cfg.total_steps, f">= num_envs ({cfg.num_envs})")
    if cfg.trial.number is not None and not (cfg.trial.storage and cfg.trial.study_name):
        # Set by the Optuna sweeper for its jobs, never by hand.
        raise ConfigError(
            "trial.number", cfg.trial.number, "null outside an Optuna sweep (hydra/sweeper=optuna)"
        )
    if cfg.progress not in ("auto", "rich", "plain", "none"):
        raise ConfigError("progress", cfg.progress, "one of auto, rich, plain, none")
    if cfg.backend.compilation_cache == "":  # would write the programs into the working folder
        raise ConfigError(
            "backend.compilation_cache", "", "a folder rlspeed can create and write to, or null"
        )
    if cfg.backend.compilation_cache is not None:
        check_creatable(
            "backend.compilation_cache",
            cfg.backend.compilation_cache,
            Path(cfg.backend.compilation_cache),
            "a folder rlspeed can create and write to, or null",
        )
    backend = BACKENDS.get(cfg.backend.name)
    engine = ENGINES.get(cfg.env.name)
    algo = ALGOS.get(cfg.algo.name)
    task = TASKS.get(cfg.task.name)
    if task.action_kind not in algo.action_kinds:
        fits = [a.name for a in ALGOS if task.action_kind in a.action_kinds]
        raise ConfigError(
            "algo",
            algo.name,
            f"an algorithm for {task.action_kind} actions on task={task.name}: {', '.join(fits)}",
        )
    if algo.tasks is not None and task.name not in algo.tasks:
        raise ConfigError(
            "task", task.name, f"a task algo={algo.name} runs on: {', '.join(algo.tasks)}"
        )
    if backend.name not in algo.backends:
        raise ConfigError("backend", backend.name, f"one of {', '.join(algo.backends)}")
    backend.check(cfg.backend)
    if engine.needs_functional_env and task.make_functional is None:
        fits = [e.name for e in ENGINES if not e.needs_functional_env]
        raise ConfigError(
            "env", engine.name, f"one of {', '.join(fits)} (task={task.name} has no JAX version)"
        )
    if engine.max_envs is not None and cfg.num_envs > (most := engine.max_envs()):
        raise ConfigError(
            "num_envs",
            cfg.num_envs,
            f"at most {most:,} on env={engine.name} (a process each: as many as this "
            "machine's memory and its open-file and process limits allow)",
        )
    task.validate(cfg.task)
    algo.validate(cfg.algo, cfg)
    try:
        TRACKERS.get(cfg.tracking.name).check(cfg.tracking)
    except StoreUnreachable as error:
        if cfg.trial.number is None:
            raise
        # A trial of a sweep whose store answered when the sweep started: losing the
        # store's copy beats losing the trial; the writer keeps trying to reach it.
        logging.getLogger("rlspeed").warning(
            "%s; trial %d trains anyway and keeps its records in its folder",
            error,
            cfg.trial.number,
        )
    # After the sizes it reads are checked; before resume= compares the config with the
    # saved one, which holds the number its run picked.
    resolve_threads(cfg)
    # Reads run folders (whole resume files): loaded only once every setting above is checked.
    from rlspeed.checkpoint import check_modes

    check_modes(cfg)
    if cfg.mode == "eval":  # every agent read back now: a damaged file is one line
        from rlspeed.evaluate import load_agents

        load_agents(cfg.checkpoint)


# backend.threads=auto: below this many multiply-adds in the run's largest matrix product,
# one thread. Measured on the 2-core CPU (compiled, 1 thread against 2; the count in
# brackets): fused DQN on CartPole [64, 64] at batch 64 (0.28 M) 154 k vs 134 k env steps/s;
# [120, 84] at 128 (1.4 M) 56 k vs 51 k; [128, 128] at 128 (2.2 M) 4.3 k vs 4.1 k; DQN
# [256, 256] at 128 (8.5 M) 1.2 k vs 1.6 k; PPO on Doors, 900 one-hot inputs into [64, 64] at
# 128 rows (7.9 M), 17-19 k vs 25-27 k. Near the line it depends on the machine: VPG's
# [64, 64] at 1,024 rows (4.5 M) ran 117 k vs 105 k in one session, 67-69 k vs 71-73 k in
# another.
ONE_THREAD_BELOW_MACS = 4_000_000


def auto_threads(cfg: DictConfig) -> int:
    """The ``backend.threads`` that ``auto`` stands for: 1 for small networks, whose ops cost
    more to hand between cores than they gain, else 0 (the library's default, one per core).

    The size is the multiply-adds of one forward pass of the largest batch the network sees
    (an update's batch, or one row per env when acting on more envs than that; times the
    seeds on the fused path, which vmaps them into the same products), from the network's
    input width (``TaskSpec.network_inputs``). Tabular algorithms have no network and keep
    the default (30 Q-learning agents: 5.7-5.8 M agent-steps/s with 2 threads, 5.5-5.7 M
    with 1).
    """
    from rlspeed.algos import network_weights
    from rlspeed.algos.loops import is_fused

    algo = cfg.algo
    if not algo.get("hidden_sizes"):
        return 0
    if "batch_size" in algo:
        rows = algo.batch_size
    else:  # on-policy: the rollout (num_steps of every env) in num_minibatches parts
        rows = algo.num_steps * cfg.num_envs // algo.get("num_minibatches", 1)
    rows = max(rows, cfg.num_envs) * (cfg.num_seeds if is_fused(cfg) else 1)
    macs = rows * network_weights(cfg)
    return 1 if macs < ONE_THREAD_BELOW_MACS else 0


def resolve_threads(cfg: DictConfig) -> None:
    """Check ``backend.threads`` and replace ``auto`` with the number it stands for, so the
    backend is set up with it and the run records it."""
    threads, cores = cfg.backend.threads, os.cpu_count() or 1
    if threads == "auto":
        cfg.backend.threads = auto_threads(cfg)
    elif isinstance(threads, str) or not 0 <= threads <= cores:
        allowed = (
            f"auto, or an integer in [0, {cores}] (0: the library's default, one thread per "
            f"core; this machine has {cores})"
        )
        raise ConfigError("backend.threads", threads, allowed)


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


def uncreatable(folder: Path) -> tuple[Path, str] | None:
    """(where, why) when nothing can be created in ``folder`` or, where it does not exist
    yet, in its nearest existing ancestor; None when something can.

    Creates nothing that stays: it makes and removes a scratch folder there, which also tests
    what permission bits cannot (``root`` passes every ``os.access`` check, yet cannot create
    anything in /proc or on a read-only mount).
    """
    existing = folder.expanduser().absolute()
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
