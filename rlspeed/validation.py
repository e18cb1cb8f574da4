"""The one check of a run's config: one ConfigError line (the key, its value, what is
allowed) for a value that cannot work, before any folder is created; else the frozen, typed
``RunConfig`` the run is built from, which is all the core sees.

``check`` checks the settings, then the algorithm's, task's, engine's and tracker's own
checks, then what ``resume=`` and ``checkpoint=`` name (``rlspeed.run_folders``), so a
damaged or foreign run folder is refused in one line too. What it reads there (resume
states, saved agents) goes to the run with the config: nothing is read twice.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from rlspeed.config import MAX_SEED_WORKERS, MAX_SEEDS, MAX_STEPS, RunConfig, is_fused
from rlspeed.config_tree import check_creatable
from rlspeed.core.algos import batch_rows, network_size
from rlspeed.core.backends import check_devices
from rlspeed.errors import ConfigError, StoreUnreachable
from rlspeed.registry import ALGOS, BACKENDS, ENGINES, TASKS, TRACKERS

if TYPE_CHECKING:
    from rlspeed.core import AgentCheckpoint
    from rlspeed.evaluate import SavedAgents

log = logging.getLogger("rlspeed")

# What a key that has no default (MISSING) takes.
MISSING_HINTS = {"task.id": "a registered Gymnasium id, e.g. task.id=Acrobot-v1"}
# A day: the longest an env's step may be waited for (env.step_timeout_s).
MAX_STEP_TIMEOUT_S = 86_400


@dataclass(frozen=True)
class CheckedRun:
    """A run's config once checked, and what the check read for it."""

    # Typed and frozen; what the config left open is settled: backend.threads=auto as its
    # number, a task's settings the env fills in (task=gym's max_steps), checkpoint_every 0
    # for an env whose runs cannot resume.
    cfg: RunConfig
    # The composed config it was checked from.
    composed: DictConfig
    # Why the run cannot resume exactly (an env keeping state rlspeed cannot save), as the
    # line its log gives; None where it can.
    unresumable: str | None
    # resume=: seed index -> the state that seed's resume file holds.
    resumed: dict[int, dict[str, Any]]
    # mode=eval: the checkpoint's saved config and its agents, read back.
    evaluated: SavedAgents | None
    # init_from=: the weights the run's agents start from (an agent file's, read back).
    initial: AgentCheckpoint | None = None

    def of(self, composed: DictConfig) -> CheckedRun | None:
        """This check, if ``composed`` is the config it checked (Hydra composes a command's
        config again to run its job); else None."""
        same = OmegaConf.to_container(composed, resolve=True) == OmegaConf.to_container(
            self.composed, resolve=True
        )
        return self if same else None


def check(composed: DictConfig) -> CheckedRun:
    """The run ``composed`` describes, checked: one ConfigError line for the first value
    that cannot work."""
    for key in sorted(OmegaConf.missing_keys(composed)):  # a value the tree cannot give
        raise ConfigError(key, "???", MISSING_HINTS.get(key, "a value (it has no default)"))
    cfg = OmegaConf.to_object(composed)
    assert isinstance(cfg, RunConfig)  # the schema rlspeed's config tree is built on
    cfg = _check_parts(cfg)
    # After the sizes it reads are checked; before resume= compares the config with the
    # saved one, which holds the number its run picked. The threads follow the workers.
    cfg = resolve_threads(resolve_seed_workers(cfg))
    if cfg.backend.devices not in ("all", 1):  # a count this machine must have
        from rlspeed.core.backends.flax import lane_devices

        lane_devices(cfg.backend)
    # Reads run folders (whole resume files): loaded only once every setting above is checked
    # (a bad setting is refused before NumPy, let alone a backend, is imported).
    from rlspeed.core.engines.env_state import check_resumable
    from rlspeed.run_folders import check_init_from, check_modes

    unresumable = check_resumable(cfg)  # builds the env: what it keeps decides resume=
    if unresumable is not None:  # auto: writing state no run can resume from gains nothing
        cfg = dataclasses.replace(cfg, checkpoint_every=0)
    resumed, evaluated = check_modes(cfg)
    return CheckedRun(cfg, composed, unresumable, resumed, evaluated, check_init_from(cfg))


def _check_parts(cfg: RunConfig) -> RunConfig:
    """The settings, then each part's own checks; returns ``cfg`` with the task's settings
    settled (``TaskSpec.settle``)."""
    if cfg.num_envs < 1:
        raise ConfigError("num_envs", cfg.num_envs, "an integer >= 1")
    if not 1 <= cfg.num_seeds <= MAX_SEEDS:
        raise ConfigError("num_seeds", cfg.num_seeds, f"an integer in [1, {MAX_SEEDS:,}]")
    for key in ("total_steps", "log_every", "eval_every"):
        if not 1 <= (value := getattr(cfg, key)) <= MAX_STEPS:
            raise ConfigError(key, value, f"an integer in [1, {MAX_STEPS:,}]")
    if not 0 <= cfg.video_every <= MAX_STEPS:
        allowed = f"0 (off) or an integer in [1, {MAX_STEPS:,}] (env steps)"
        raise ConfigError("video_every", cfg.video_every, allowed)
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
    if not 0 < cfg.env.step_timeout_s <= MAX_STEP_TIMEOUT_S:
        allowed = f"a number of seconds in (0, {MAX_STEP_TIMEOUT_S:,}]"
        raise ConfigError("env.step_timeout_s", cfg.env.step_timeout_s, allowed)
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
    if task.check_algo is not None:
        task.check_algo(cfg.task, algo)
    elif task.action_kind not in algo.action_kinds:
        fits = [a.name for a in ALGOS if task.action_kind in a.action_kinds]
        raise ConfigError(
            "algo",
            algo.name,
            f"an algorithm for {task.action_kind} actions on task={task.name}: {', '.join(fits)}",
        )
    # AlgoSpec.tasks lists rlspeed's own tasks the algorithm is offered on; a plug-in's task
    # is offered to every algorithm that fits its spaces.
    if algo.tasks is not None and task.name not in algo.tasks and TASKS.is_builtin(task.name):
        raise ConfigError(
            "task", task.name, f"a task algo={algo.name} runs on: {', '.join(algo.tasks)}"
        )
    algo.check_stack(backend.name, engine.name)
    backend.check(cfg.backend)
    check_devices(cfg.backend, is_fused(cfg))
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
    cfg = dataclasses.replace(cfg, task=task.settle(cfg.task))
    task.validate(cfg.task)
    algo.validate(cfg.algo, cfg)
    try:
        TRACKERS.get(cfg.tracking.name).check(cfg.tracking)
    except StoreUnreachable as error:
        if cfg.trial.number is None:
            raise
        # A trial of a sweep whose store answered when the sweep started: losing the
        # store's copy beats losing the trial; the writer keeps trying to reach it.
        log.warning(
            "%s; trial %d trains anyway and keeps its records in its folder",
            error,
            cfg.trial.number,
        )
    return cfg


# backend.threads=auto: below this many multiply-adds in the run's largest matrix product,
# one thread. Measured on the 2-core CPU (compiled, 1 thread against 2; the count in
# brackets): fused DQN on CartPole [64, 64] at batch 64 (0.28 M) 154 k vs 134 k env steps/s;
# [120, 84] at 128 (1.4 M) 56 k vs 51 k; [128, 128] at 128 (2.2 M) 4.3 k vs 4.1 k; DQN
# [256, 256] at 128 (8.5 M) 1.2 k vs 1.6 k; PPO on Doors, 900 one-hot inputs into [64, 64] at
# 128 rows (7.9 M), 17-19 k vs 25-27 k. Near the line it depends on the machine: VPG's
# [64, 64] at 1,024 rows (4.5 M) ran 117 k vs 105 k in one session, 67-69 k vs 71-73 k in
# another.
ONE_THREAD_BELOW_MACS = 4_000_000


def auto_threads(cfg: RunConfig) -> int:
    """The ``backend.threads`` that ``auto`` stands for: 1 for small networks, whose ops cost
    more to hand between cores than they gain, else 0 (the library's default, one per core).

    The size is the multiply-adds of one forward pass of the largest batch the network sees
    (an update's batch, or one row per env when acting on more envs than that; times the
    seeds on the fused path, which vmaps them into the same products), from the network's
    input width and image shape (``TaskSpec.network_inputs``, ``TaskSpec.image_shape``).
    Tabular algorithms have no network and keep the default (30 Q-learning agents: 5.7-5.8 M
    agent-steps/s with 2 threads, 5.5-5.7 M with 1).

    Torch's larger networks take every core but one: its intra-op threads meet at the end of
    every op, so one thread whose core another program holds stalls them all. TD3 on Hopper
    (256x256, batch 256) on the 2-core CPU: 148 updates/s on both cores quiet, 6-7 beside one
    busy process; 111 on one core quiet, where one busy process leaves it its own core.
    """
    if not getattr(cfg.algo, "hidden_sizes", None):
        return 0
    rows = batch_rows(cfg) * (cfg.num_seeds if is_fused(cfg) else 1)
    macs = rows * network_size(cfg).multiply_adds
    if macs < ONE_THREAD_BELOW_MACS:
        return 1
    return max(1, (os.cpu_count() or 1) - 1) if cfg.backend.name == "torch" else 0


def resolve_threads(cfg: RunConfig) -> RunConfig:
    """Check ``backend.threads``; returns ``cfg`` with ``auto`` as the number it stands
    for, so the backend is set up with it and the run records it. Where seeds train in
    several worker processes (``backend.seed_workers``, resolved), a network that ``auto``
    gives every core gets its share of them in each worker."""
    threads, cores = cfg.backend.threads, os.cpu_count() or 1
    if threads == "auto":
        picked = auto_threads(cfg)
        workers = cfg.backend.seed_workers
        assert isinstance(workers, int)  # resolved first (resolve_seed_workers)
        if workers > 1 and picked != 1:
            picked = max(1, cores // workers)
        backend = dataclasses.replace(cfg.backend, threads=picked)
        return dataclasses.replace(cfg, backend=backend)
    if isinstance(threads, str) or not 0 <= threads <= cores:
        allowed = (
            f"auto, or an integer in [0, {cores}] (0: the library's default, one thread per "
            f"core; this machine has {cores})"
        )
        raise ConfigError("backend.threads", threads, allowed)
    return cfg


def resolve_seed_workers(cfg: RunConfig) -> RunConfig:
    """Check ``backend.seed_workers``; returns ``cfg`` with it as the number of worker
    processes the run's seeds train in: ``auto`` as one per CPU core (one per GPU where the
    agent lives on CUDA), never more than ``num_seeds``; 1 where they train in the run's own
    process (the fused path's seeds are lanes of its one program)."""
    value = cfg.backend.seed_workers
    if value != "auto" and (isinstance(value, str) or not 1 <= value <= MAX_SEED_WORKERS):
        allowed = (
            f"auto, or an integer in [1, {MAX_SEED_WORKERS}] (worker processes that train a "
            "host-driven run's seeds at once; 1: one after another)"
        )
        raise ConfigError("backend.seed_workers", value, allowed)
    if is_fused(cfg):
        if value not in ("auto", 1):
            allowed = (
                "1 or auto on the fused path (backend=flax env=jax-vmap): its seeds are lanes "
                "of one program already"
            )
            raise ConfigError("backend.seed_workers", value, allowed)
        workers = 1
    elif value == "auto":
        gpus = BACKENDS.get(cfg.backend.name).worker_gpus(cfg.backend) if cfg.num_seeds > 1 else 0
        workers = gpus or os.cpu_count() or 1
    else:
        assert isinstance(value, int)  # checked above
        workers = value
    workers = min(workers, cfg.num_seeds)
    if workers > 1 and (given := TASKS.given(cfg.task.name)) is not None:
        from rlspeed.checkpoint import why  # NumPy and more: only where it is wanted

        try:  # a worker process takes a task given to rlspeed.train by pickle
            pickle.dumps(given)
        except Exception as error:  # noqa: BLE001 - whatever pickling the user's object raised
            allowed = (
                f"1 with task={cfg.task.name}, a TaskSpec given to rlspeed.train that does not "
                f"pickle ({why(error)}): seed workers take it by pickle, so its "
                "functions must be a module's top-level ones"
            )
            raise ConfigError("backend.seed_workers", value, allowed) from None
    return dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, seed_workers=workers))
