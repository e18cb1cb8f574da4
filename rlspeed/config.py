"""Typed schemas of the config tree (what a run is: its backend, engine, task, algorithm
and run-level settings) and the bounds every size has. Frozen dataclasses: Hydra builds
its config tree on them (``rlspeed.config_tree``, whose nodes of them take overrides); the
checked config of a run is made of them and never changes (``rlspeed.validation.check``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# What the config tree marks as a value that must be given (OmegaConf's MISSING).
MISSING: Any = "???"


@dataclass(frozen=True)
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
    # A fused run's lanes (its seeds, a batch of trials) spread over JAX's local devices:
    # all, or a count of them (the first ones). One program, the same numbers per lane.
    devices: int | str = "all"
    # A host-driven run's seeds (num_seeds > 1, every stack but flax + jax-vmap) train in this
    # many worker processes at once: an integer, or auto (one per CPU core, or one per GPU
    # where the backend is on CUDA; never more than num_seeds). 1: one after another in the
    # run's own process. Each seed's numbers are the same either way (README).
    seed_workers: int | str = 1
    # backend=flax: the folder where compiled XLA programs are kept between runs (JAX's
    # persistent compilation cache); None compiles every program in every run.
    compilation_cache: str | None = None


@dataclass(frozen=True)
class EngineConfig:
    name: str = MISSING
    # AsyncVectorEnv only: observations travel through shared memory.
    shared_memory: bool = True
    # AsyncVectorEnv only: seconds a step of the envs may take before the run takes an env
    # that has not answered to hang, and ends in one line naming it.
    step_timeout_s: float = 600.0


@dataclass(frozen=True)
class TrackingConfig:
    name: str = MISSING
    # MLflow tracking URI; None means MLFLOW_TRACKING_URI or MLflow's default local store.
    uri: str | None = None
    experiment: str = "rlspeed"
    # MLflow run to nest this run under (an Optuna study's parent run); set by the sweeper.
    parent_run_id: str | None = None
    # tracking=tensorboard: the folder of the event files; None: <run folder>/tensorboard.
    log_dir: str | None = None
    # tracking=wandb (rlspeed.tracking.wandb): the W&B project (None: WANDB_PROJECT, else
    # rlspeed) and entity (None: W&B's default); mode online, offline or disabled (None:
    # WANDB_MODE, else online); the folder W&B keeps its wandb/ in (None: WANDB_DIR, else
    # the run folder); the run's group (None: an Optuna trial's study) and tags of its own.
    project: str | None = None
    entity: str | None = None
    mode: str | None = None
    dir: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TaskConfig:
    """Fields every task has; each task's schema extends it."""

    name: str = MISSING
    # Training episode length (time-limit truncation).
    max_steps: int = MISSING


@dataclass(frozen=True)
class TrialConfig:
    """The Optuna trial a run belongs to; set only by the Optuna sweeper, per job."""

    # Where the study lives (a journal file path or a database URL).
    storage: str | None = None
    study_name: str | None = None
    number: int | None = None
    # Whether the trial keeps its resume state once it has finished (the sweeper's
    # keep_resume): only an interrupted run continues from it.
    keep_resume: bool = False


@dataclass(frozen=True)
class RunConfig:
    backend: BackendConfig = field(default_factory=BackendConfig)
    env: EngineConfig = field(default_factory=EngineConfig)
    algo: Any = MISSING
    task: Any = MISSING
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)
    seed: int = 1
    # Independent agents trained in one run, with seeds seed, seed+1, ...: one vmap-ed
    # program on the fused path, one after another elsewhere (or in backend.seed_workers
    # processes at once).
    num_seeds: int = 1
    # Parallel copies of the task; each engine option sets its own default.
    num_envs: int = MISSING
    # task=gym: a Gymnasium id rlspeed has tuned settings for (CartPole-v1, Pendulum-v1, the
    # MuJoCo ids: rlspeed.gym_ids) runs with them; false: the algorithm's general defaults.
    tuned: bool = True
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
    # A run folder or agent file whose agent's weights this new run's agent starts from
    # (its optimizers, counters and random streams start fresh, from seed).
    init_from: str | None = None
    checkpoint: str | None = None
    # mode=eval: a GIF (or MP4) of one greedy episode; a relative path goes into the eval's
    # folder.
    video: str | None = None
    # Env steps between videos of a greedy episode while the run trains (0: none), each
    # into <run folder>/videos/step_<env step>.gif and the tracked run.
    video_every: int = 0


# The (backend, engine) of a fused run: one program, flax on the functional jax-vmap engine.
FUSED_STACK = ("flax", "jax-vmap")


def is_fused(cfg: RunConfig) -> bool:
    """Whether the run is one fused program."""
    return (cfg.backend.name, cfg.env.name) == FUSED_STACK


# Env steps are counted in int32 on the fused path (at most 2,147,483,647); this leaves
# room for the round-up to whole iterations.
MAX_STEPS = 2_000_000_000
# The longest evaluation episode (task=gym: an id's registered max_episode_steps, or its
# task.max_steps where it registers none): a score waits for all its episodes to end, one
# batched policy call per step. Standard limits are far shorter (MuJoCo's 1,000).
MAX_EPISODE_STEPS = 100_000
# backend.seed_workers: a count above this is a typo (each worker is a process with its own
# backend and envs).
MAX_SEED_WORKERS = 256
# Seeds of one run: on the fused path lanes of one program (rlspeed-bench qlearn runs 1,024
# Q-learning agents), elsewhere trainings one after another; each has its own metrics
# (seed<i>/<name>) and rows in metrics.json. The memory checks count what each holds.
MAX_SEEDS = 65_536

# Each seed's "rolling reward": total reward / total steps over its last 2000 episodes (the
# monitor keeps their returns and lengths; the memory checks count them).
ROLLING_EPISODES = 2000


def env_id(task: Any) -> str | None:
    """The id of the env a task makes where the task takes one (``task.id``: a Gymnasium or
    gymnax id), None elsewhere or where it is not set yet; ``task`` a typed or a composed
    config."""
    try:
        value = getattr(task, "id", None)
    except Exception:  # noqa: BLE001 - a composed config's id that is still missing (???)
        return None
    return None if value in (None, "???") or value == task.name else str(value)


def task_label(task: Any) -> str:
    """The task as runs are named (folders, tracked runs, the summary, the learning curve):
    its name, and the id of its env where it has one, in characters a file name can hold:
    ``gym-Hopper-v5``, ``gymnax-Breakout-MinAtar``."""
    identifier = env_id(task)
    if identifier is None:
        return str(task.name)
    return f"{task.name}-{re.sub(r'[^A-Za-z0-9._-]+', '-', identifier).strip('-')}"


def plain(value: Any) -> Any:
    """A config or a part of one as plain Python values: a dict for a mapping or a schema's
    dataclass, a list for a sequence (what JSON and an env's constructor take)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(item) for item in value]
    return value
