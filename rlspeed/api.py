"""rlspeed from Python: ``train`` runs what the ``rlspeed`` command runs, with its checks,
into a run folder of its own; ``load`` reads a run folder's agent back to act with.

    import rlspeed

    result = rlspeed.train(algo="dqn", task="cartpole", backend="flax", env="jax-vmap",
                           total_steps=50_000, tracking="none")
    agent = rlspeed.load(result.output_dir)
    action = agent.act(observation)

``task`` may also be a ``TaskSpec`` of one's own: an option of the ``task`` group for that
call only (``rlspeed.registry.Registry.registered``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlspeed.config_tree import quote
from rlspeed.core.tasks import TaskSpec
from rlspeed.errors import ConfigError, RLSpeedError
from rlspeed.registry import TASKS

if TYPE_CHECKING:
    from rlspeed.config import RunConfig
    from rlspeed.validation import CheckedRun

# The config groups ``train`` takes by name: an option of conf/<group>/.
GROUPS = ("algo", "task", "backend", "env", "tracking")


class Agent:
    """A saved agent's greedy policy: ``act`` one observation, ``act_batch`` many. A run of
    several seeds saved one agent per seed; ``seed`` picks one (the first by default)."""

    def __init__(self, config: RunConfig, policies: dict[int, Any], seed: int) -> None:
        # The config of the run that trained it (its folder's config.yaml).
        self.config = config
        self.seeds = sorted(policies)
        self.seed = seed
        self._policy = policies[seed]

    def act_batch(self, observations: Any) -> np.ndarray:
        """Greedy actions of observations stacked on a first axis [B, ...]."""
        return np.asarray(self._policy(np.asarray(observations)))

    def act(self, observation: Any) -> Any:
        """The greedy action of one observation, as a Gymnasium env's ``step`` takes it."""
        return self.act_batch(np.asarray(observation)[None])[0]

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"Agent(algo={cfg.algo.name}, task={cfg.task.name}, backend={cfg.backend.name}, "
            f"seed={self.seed})"
        )


def load(folder: str | Path, seed: int | None = None, task: TaskSpec | None = None) -> Agent:
    """The agent a run saved in ``folder`` (a run folder, or an agent file in one); ``seed``
    picks one agent of a multi-seed run; ``task``: the TaskSpec a run trained with
    ``train(task=<TaskSpec>)`` (it is no option otherwise). Only arrays are read: nothing in
    the folder runs."""
    from rlspeed.checkpoint import agent_files
    from rlspeed.config_tree import register_configs
    from rlspeed.evaluate import load_agents

    register_configs()
    if not agent_files(str(folder)):
        raise ConfigError(
            "folder", folder, "a run folder holding checkpoint.pt or checkpoint.msgpack"
        )
    with _given_task(task):
        saved, agents = load_agents(str(folder))
    policies = {agent_seed: policy for agent_seed, policy, _ in agents}
    if seed is None:
        seed = min(policies)
    if seed not in policies:
        raise ConfigError("seed", seed, f"one of the saved agents' seeds: {sorted(policies)}")
    return Agent(saved, policies, seed)


class Result:
    """What ``train`` returns: the run's score, its folder and what it recorded there."""

    def __init__(self, score: float, output_dir: Path, task: TaskSpec | None = None) -> None:
        # The task's greedy score (the mean over seeds where there are several).
        self.score = score
        # The run folder: config, agent, metrics, learning curve (``rlspeed.load`` reads it).
        self.output_dir = output_dir
        # The TaskSpec given to ``train``, if one was: ``agent`` reads the run back with it.
        self.task = task

    @cached_property
    def metrics(self) -> dict[str, Any]:
        """The run's metrics.json: status, rates, every logged row."""
        from rlspeed.checkpoint import read_metrics

        return read_metrics(self.output_dir)

    @cached_property
    def agent(self) -> Agent:
        """The trained agent (its checkpoint, read back)."""
        return load(self.output_dir, task=self.task)

    def __repr__(self) -> str:
        return f"Result(score={self.score:.4f}, output_dir={str(self.output_dir)!r})"


def train(
    algo: str | None = None,
    task: str | TaskSpec | None = None,
    backend: str | None = None,
    env: str | None = None,
    tracking: str | None = None,
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    **overrides: Any,
) -> Result:
    """Train as ``rlspeed`` would with these choices and overrides, e.g.
    ``train(algo="ppo", task="cartpole", total_steps=100_000, **{"algo.learning_rate": 3e-4})``;
    ``resume=<run folder>`` with a larger ``total_steps`` trains a run further,
    ``init_from=<run folder>`` starts a new run from its agent's weights (README,
    "Continuing a run").

    Unset groups take the command's defaults. The config is checked as the command checks
    it (a bad value raises ConfigError naming key, value and what is allowed, before anything
    is created). Outputs go to ``out_dir``, by default a new folder under ``outputs/`` named
    as the command names it; a folder a run has written already is refused, unless
    ``overwrite`` (it is then emptied first). ``task`` is an option's name, or a
    ``TaskSpec`` that is an option (its ``name``) for this call only; ``task.*`` overrides
    set its schema's keys."""
    given = None if task is None or isinstance(task, str) else task
    with _given_task(given):
        name = given.name if given is not None else task
        assert name is None or isinstance(name, str)
        score, run_dir = _train(algo, name, backend, env, tracking, out_dir, overwrite, overrides)
    return Result(score, run_dir, given)


@contextlib.contextmanager
def _given_task(task: TaskSpec | None) -> Iterator[None]:
    """``task`` as an option of the ``task`` group while the block runs (none: nothing)."""
    if task is None:
        yield
        return
    if not isinstance(task, TaskSpec):
        raise ConfigError(
            "task", repr(task)[:60], "an option's name or a rlspeed.core.tasks.TaskSpec"
        )
    with TASKS.registered(task):
        yield


def _train(
    algo: str | None,
    task: str | None,
    backend: str | None,
    env: str | None,
    tracking: str | None,
    out_dir: str | Path | None,
    overwrite: bool,
    overrides: dict[str, Any],
) -> tuple[float, Path]:
    from rlspeed import secrets
    from rlspeed.cli import CONF_DIR, set_up_config_tree
    from rlspeed.machine import choose_mujoco_gl
    from rlspeed.preflight import check_overrides

    chosen = dict(zip(GROUPS, (algo, task, backend, env, tracking), strict=True))
    arguments = [f"{group}={name}" for group, name in chosen.items() if name is not None]
    arguments += [f"{key}={_hydra_value(value)}" for key, value in overrides.items()]
    told = "tracking.uri" in overrides or os.environ.get("MLFLOW_TRACKING_URI")
    if tracking in (None, "mlflow") and not told:
        arguments.append(f"tracking.uri={_hydra_value(default_store(out_dir))}")
    hydra_arguments = [] if out_dir is None else [f"hydra.run.dir={_hydra_value(str(out_dir))}"]
    secrets.install(streams=False)  # the caller's streams stay theirs
    choose_mujoco_gl()  # video_every's MuJoCo frames, where mujoco is not imported yet
    arguments = secrets.hide_in_arguments(arguments)
    set_up_config_tree()
    if out_dir is not None:
        _check_out_dir(Path(out_dir), overwrite)
    checked = check_overrides(arguments, hydra_arguments, CONF_DIR)
    if out_dir is not None and overwrite and Path(out_dir).exists():
        shutil.rmtree(out_dir)  # a run folder (_check_out_dir), its settings checked
    return _run_job(CONF_DIR, [*arguments, *hydra_arguments], checked)


def default_store(out_dir: str | Path | None) -> str:
    """Where ``train`` tracks in MLflow unless told otherwise (``tracking.uri``,
    ``MLFLOW_TRACKING_URI``): a SQLite store beside the run folder, ``outputs/mlflow.db`` by
    default (its runs' files in ``outputs/mlruns/``), not the notebook's own folder."""
    folder = Path("outputs") if out_dir is None else Path(out_dir).parent
    return f"sqlite:///{(folder / 'mlflow.db').resolve()}"


# What a run writes in its folder first: a folder holding one is a run's.
RUN_FILES = ("config.yaml", ".hydra", "metrics.json")


def _check_out_dir(folder: Path, overwrite: bool) -> None:
    """``out_dir``: a new or empty folder, or with ``overwrite`` a run's (never another
    folder with files in it: emptying it would delete what is not rlspeed's)."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    if not any((folder / name).exists() for name in RUN_FILES):
        raise ConfigError("out_dir", folder, "a new or empty folder, or a run folder")
    if not overwrite:
        allowed = "a folder no run has written yet, or overwrite=True to replace that run"
        raise ConfigError("out_dir", folder, allowed)


def _run_job(conf_dir: str, arguments: list[str], checked: CheckedRun) -> tuple[float, Path]:
    """Run one Hydra job of the composed config, as ``hydra.main`` runs one: its folder,
    ``.hydra/`` files and log file, then ``rlspeed.run.run`` inside it (with ``checked``,
    the check of its config)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job, setup_globals
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict

    from rlspeed.run import run

    setup_globals()
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        cfg = compose(config_name="config", overrides=arguments, return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.mode = RunMode.RUN
        context = HydraContext(GlobalHydra.instance().config_loader(), Callbacks(cfg))
        job = run_job(
            lambda job_cfg: run(job_cfg, checked.of(job_cfg)), cfg, "hydra.run.dir", None, context
        )
    score = job.return_value  # raises what the run raised
    assert job.hydra_cfg is not None  # run_job sets it before it runs the job
    out_dir = Path(job.hydra_cfg.hydra.runtime.output_dir)
    if not isinstance(score, float):
        raise RLSpeedError(f"rlspeed: the run in {out_dir} returned no score")
    return score, out_dir


def _hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar: strings quoted (so ``"1e-3"`` or ``"null"``
    stay strings and a path's characters need no escaping), lists and dicts as literals."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return quote(str(value))
    if isinstance(value, Mapping):
        items = ", ".join(f"{key}: {_hydra_value(item)}" for key, item in value.items())
        return "{" + items + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_hydra_value(item) for item in value) + "]"
    raise TypeError(f"rlspeed.train: {value!r} is not a config value (str, number, bool, ...)")
