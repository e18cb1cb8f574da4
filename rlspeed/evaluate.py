"""``rlspeed mode=eval checkpoint=PATH [video=FILE.gif]``: score a saved agent as training's
``eval/score`` does (the task's greedy score at standard settings) and film one episode.

The run's own ``config.yaml`` (beside the checkpoint) says which task, algorithm and
backend built the agent; each algorithm's backend module reads its checkpoint back with
``load_policies(cfg, path)`` (one greedy policy per agent the file holds).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rlspeed.checkpoint import agent_files, read_agent, why
from rlspeed.config import RunConfig, is_fused
from rlspeed.config_tree import schema_node
from rlspeed.core.tasks import Policy
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS, BACKENDS, TASKS
from rlspeed.saved_config import read_config
from rlspeed.video import described, film, write_video

log = logging.getLogger("rlspeed")

# (seed, greedy policy, file) of each agent a checkpoint holds.
Agents = list[tuple[int, Policy, Path]]
# A checkpoint read back: the config its run trained with, and its agents.
SavedAgents = tuple[RunConfig, Agents]


def load_agents(value: str) -> SavedAgents:
    """The saved config of ``checkpoint=value`` (a run folder or an agent file in one) and
    its agents, each with the evaluation seed training gave it; one ConfigError line for
    files that cannot be read back (checked before anything is created)."""
    paths = agent_files(value)  # not empty, and config.yaml readable: check_modes
    read = read_config("checkpoint", value, paths[0].parent)
    run = f"algo={read.algo.name} backend={read.backend.name} task={read.task.name}"
    try:
        with warnings.catch_warnings():
            # A file that is not what it should be can make a loader warn before it fails.
            warnings.simplefilter("ignore")
            saved = saved_run_config(read)
            task = TASKS.get(saved.task.name)
            BACKENDS.get(saved.backend.name).setup(saved.backend, saved.seed)
            env = task.make_env(saved.task)
            agents: Agents = []
            for path in paths:
                first = saved.seed + _seed_index(path)
                policies = _load_policies(saved, path, env.observation_space, env.action_space)
                agents += [(first + i, policy, path) for i, policy in enumerate(policies)]
            env.close()
    except Exception as error:  # damaged, cut short, of another run, of another version
        raise ConfigError(
            "checkpoint", value, f"agent files that a run of its {run} wrote, whole ({why(error)})"
        ) from None
    return saved, agents


def evaluate_checkpoint(cfg: RunConfig, evaluated: SavedAgents, out_dir: Path) -> float:
    """Score every agent of the checkpoint (``evaluated``: as ``load_agents`` read it);
    print and return their mean score. ``video=``: the first agent's greedy episode, in
    ``out_dir`` (the eval's folder) where the path is relative (``video_path``)."""
    saved, agents = evaluated
    task = TASKS.get(saved.task.name)
    scores = []
    on_device = task.evaluate_on_device is not None and is_fused(saved)
    for seed, policy, path in agents:
        if on_device:  # as training scored it: on the task's JAX twin
            from rlspeed.core.algos.loops.fused import DevicePolicy
            from rlspeed.core.algos.loops.fused_training import device_score

            assert isinstance(policy, DevicePolicy)  # what a fused run's agents load as
            scores.append(device_score(task, saved.task, policy, seed))
        else:
            scores.append(task.evaluate(saved.task, policy, seed))
        print(f"rlspeed: score {scores[-1]:.4f} (seed {seed}, {path})")
    if cfg.video is not None:
        seed, policy, _ = agents[0]
        filmed = film(task, saved.task, policy, seed)
        path = video_path(cfg.video, out_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"rlspeed: video of {described(filmed, write_video(filmed, path))}")
    return float(np.mean(scores))


def video_path(value: str, out_dir: Path) -> Path:
    """Where ``video=value`` is written: an absolute path as given, a relative one in the
    eval's folder ``out_dir`` (beside its log)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else out_dir / path


def saved_run_config(saved: DictConfig) -> RunConfig:
    """A run folder's config as the typed config its run trained with; keys it lacks at
    their schema's defaults (an agent saved before an option existed loads with it at its
    default, off)."""
    tree = schema_node(RunConfig)
    tree.algo = schema_node(ALGOS.get(saved.algo.name).schema)
    tree.task = schema_node(TASKS.get(saved.task.name).schema)
    typed = OmegaConf.to_object(OmegaConf.merge(tree, saved))
    assert isinstance(typed, RunConfig)  # the schema the tree is built on
    return typed


def _load_policies(saved: RunConfig, path: Path, obs_space: Any, action_space: Any) -> list[Policy]:
    module = ALGOS.get(saved.algo.name).backend_module(saved.backend.name)
    agent = read_agent(path, saved.backend.name)
    return module.load_policies(saved, agent, obs_space, action_space)


def _seed_index(path: Path) -> int:
    index = path.stem.removeprefix("checkpoint_seed")
    return int(index) if index.isdigit() else 0
