"""``rlspeed mode=eval checkpoint=PATH [video=FILE.gif]``: score a saved agent as training's
``eval/score`` does (the task's greedy score at standard settings) and film one episode.

The run's own ``config.yaml`` (beside the checkpoint) says which task, algorithm and
backend built the agent; each algorithm's backend module reads its checkpoint back with
``load_policies(cfg, path)`` (one greedy policy per agent the file holds).
"""

from __future__ import annotations

import importlib.util
import logging
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rlspeed.checkpoint import agent_files, read_agent, why
from rlspeed.config import RunConfig, is_fused
from rlspeed.config_tree import schema_node
from rlspeed.core.tasks import Policy
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS, BACKENDS, TASKS
from rlspeed.saved_config import read_config
from rlspeed.seeding import eval_seeds

if TYPE_CHECKING:
    from rlspeed.core.tasks import TaskSpec

log = logging.getLogger("rlspeed")

# Pixels per text cell when an env's ``ansi`` frames are painted.
CELL = 24
COLORS = {
    ".": (245, 245, 245),  # empty
    " ": (245, 245, 245),
    "#": (60, 60, 60),  # wall
    "A": (30, 100, 220),  # agent
    "G": (40, 170, 70),  # goal
}
OTHER = (220, 120, 40)
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


def evaluate_checkpoint(cfg: RunConfig, evaluated: SavedAgents) -> float:
    """Score every agent of the checkpoint (``evaluated``: as ``load_agents`` read it);
    print and return their mean score."""
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
        frames, fps = film(task, saved, policy, seed)
        _write_video(frames, fps, Path(cfg.video).expanduser())
        print(f"rlspeed: video of one episode ({len(frames)} frames): {cfg.video}")
    return float(np.mean(scores))


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


def film(
    task: TaskSpec, saved: RunConfig, policy: Policy, seed: int
) -> tuple[list[np.ndarray], int]:
    """RGB frames of one greedy episode, reset with the run's first evaluation seed, and
    the env's frame rate."""
    env = task.make_env(saved.task)
    mode = render_mode(env)
    env.unwrapped.render_mode = mode
    obs, _ = env.reset(seed=eval_seeds(seed, 1)[0])
    frames = [_frame(env.render(), mode)]
    done = False
    while not done:
        action = np.asarray(policy(np.asarray(obs)[None]))[0]
        obs, _, terminated, truncated, _ = env.step(action)
        frames.append(_frame(env.render(), mode))
        done = terminated or truncated
    env.close()
    # A text frame may gain a line (FrozenLake's last action): one size for the video.
    height, width = (max(frame.shape[i] for frame in frames) for i in (0, 1))
    frames = [
        np.pad(f, ((0, height - f.shape[0]), (0, width - f.shape[1]), (0, 0)), constant_values=245)
        for f in frames
    ]
    return frames, int(env.metadata.get("render_fps", 30))


def _frame(rendered: Any, mode: str | None) -> np.ndarray:
    if mode == "rgb_array":
        return np.asarray(rendered, dtype=np.uint8)
    # Other envs' text frames (task=gym) may colour with escape codes and vary in width.
    rows = ANSI_ESCAPE.sub("", str(rendered)).rstrip("\n").split("\n")
    width = max(len(row) for row in rows)
    cells = np.array(
        [[COLORS.get(ch, OTHER) for ch in row.ljust(width)] for row in rows], dtype=np.uint8
    )
    return np.kron(cells, np.ones((CELL, CELL, 1), dtype=np.uint8))


def _write_video(frames: list[Any], fps: int, path: Path) -> None:
    """``frames``: RGB arrays [height, width, 3] of uint8."""
    import imageio.v2 as imageio

    if path.suffix.lower() == ".gif":
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps)


def render_mode(env: Any) -> str | None:
    """How rlspeed films ``env``: its ``rgb_array`` frames where they can be drawn here,
    else its text frames (``ansi``) painted as cells; None when it has neither."""
    modes = env.metadata.get("render_modes", [])
    if "rgb_array" in modes and importlib.util.find_spec("pygame") is not None:
        return "rgb_array"
    return "ansi" if "ansi" in modes else None
