"""Videos of an agent's greedy episodes: ``mode=eval video=FILE`` films a saved agent, and
``video_every=N`` films the training agent every N env steps into ``<run folder>/videos/``,
each video a tracked artifact as soon as it is written.

An episode is filmed on an env of its own, reset with the agent's first evaluation seed, so
a run's videos all start alike. A frame is the env's ``rgb_array`` image where it draws one
here, else its text frame (``ansi``) painted as cells. MuJoCo draws with OpenGL, which on a
machine without a display needs EGL or OSMesa: ``rlspeed.machine.choose_mujoco_gl`` picks
one at the command's start; an env that still draws no frame is one line naming what to install.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from rlspeed.config import env_id
from rlspeed.errors import ConfigError, one_line
from rlspeed.machine import GL_PACKAGES
from rlspeed.monitor import to_log_file
from rlspeed.seeding import eval_seeds

if TYPE_CHECKING:
    import gymnasium as gym

    from rlspeed.config import TaskConfig
    from rlspeed.core.tasks import Policy, TaskSpec
    from rlspeed.tracking import Tracker

log = logging.getLogger("rlspeed")

# The RGB frames one video holds at most while it is written (an episode longer than that
# is filmed up to there): a 1,000-step MuJoCo episode at Gymnasium's 480 x 480 is 0.69 GB.
MAX_VIDEO_BYTES = 768 << 20
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
# Where video_every's videos go in the run folder.
VIDEO_FOLDER = "videos"


class CannotFilm(Exception):
    """Why an env cannot be filmed here."""


class Film(NamedTuple):
    # RGB arrays [height, width, 3] of uint8, all of one size.
    frames: list[np.ndarray]
    fps: int
    # Whether the episode went on after the last frame (MAX_VIDEO_BYTES).
    cut: bool


def film(task: TaskSpec, task_cfg: TaskConfig, policy: Policy, seed: int) -> Film:
    """One greedy episode of ``policy``, reset with the first evaluation seed of ``seed``."""
    env = task.make_env(task_cfg)
    try:
        mode = set_render_mode(env)
        obs, _ = env.reset(seed=eval_seeds(seed, 1)[0])
        frames = [_frame(env.render(), mode)]
        held, cut, done = frames[0].nbytes, False, False
        while not done:
            action = np.asarray(policy(np.asarray(obs)[None]))[0]
            obs, _, terminated, truncated, _ = env.step(action)
            frame = _frame(env.render(), mode)
            held += frame.nbytes
            if held > MAX_VIDEO_BYTES:
                cut = True
                break
            frames.append(frame)
            done = terminated or truncated
        fps = int(env.metadata.get("render_fps") or 30)
    finally:
        env.close()
    # A text frame may gain a line (FrozenLake's last action): one size for the video.
    height, width = (max(frame.shape[i] for frame in frames) for i in (0, 1))
    frames = [
        np.pad(f, ((0, height - f.shape[0]), (0, width - f.shape[1]), (0, 0)), constant_values=245)
        for f in frames
    ]
    return Film(frames, fps, cut)


def film_or_why(task: TaskSpec, task_cfg: TaskConfig, policy: Policy, seed: int) -> Film | str:
    """``film``'s episode, or why it could not be filmed (one line)."""
    try:
        return film(task, task_cfg, policy, seed)
    except Exception as error:  # noqa: BLE001 - training goes on without this video
        return one_line(error)


def set_render_mode(env: gym.Env[Any, Any]) -> str:
    """Film ``env`` in ``rgb_array`` where it draws a frame here (one is drawn to know), else
    in ``ansi``: the mode set. CannotFilm says why it can be neither."""
    modes = env.metadata.get("render_modes", [])
    failed = "it draws neither rgb_array nor ansi frames"
    if "rgb_array" in modes:
        env.unwrapped.render_mode = "rgb_array"
        try:
            with warnings.catch_warnings():  # GLFW warns of a missing display, then fails
                warnings.simplefilter("ignore")
                env.reset(seed=0)  # Gymnasium renders an env once it is reset
                np.asarray(env.render(), dtype=np.uint8)
            return "rgb_array"
        except Exception as error:  # noqa: BLE001 - a library missing here, said in the line
            failed = f"its rgb_array frame failed: {one_line(error)}"
            if _drawn_by_mujoco(env):
                failed = _mujoco_gl_hint(error)
    if "ansi" in modes:
        env.unwrapped.render_mode = "ansi"
        return "ansi"
    raise CannotFilm(failed)


def _drawn_by_mujoco(env: gym.Env[Any, Any]) -> bool:
    """Whether MuJoCo draws ``env``'s frames: Gymnasium's MuJoCo envs (a user's subclass
    too) and envs that say so (``draws_with_mujoco``: Playground's, behind a Gymnasium face)."""
    unwrapped = env.unwrapped
    if getattr(unwrapped, "draws_with_mujoco", False):
        return True
    return any(cls.__module__.startswith("gymnasium.envs.mujoco") for cls in type(unwrapped).mro())


def _mujoco_gl_hint(error: Exception) -> str:
    chosen = os.environ.get("MUJOCO_GL")
    used = f"MUJOCO_GL={chosen}" if chosen else "MUJOCO_GL unset"
    return (
        f"MuJoCo drew no frame with {used} ({one_line(error)}); without a display it draws "
        "through EGL or OSMesa, which rlspeed picks when MUJOCO_GL is unset and its library "
        f"loads: on Debian or Ubuntu {GL_PACKAGES}"
    )


def check_filmable(key: str, value: object, allowed: str, task: TaskSpec, cfg: TaskConfig) -> None:
    """One ConfigError line (``allowed``, then why) where task ``cfg`` cannot be filmed here."""
    env = task.make_env(cfg)
    try:
        set_render_mode(env)
    except CannotFilm as why:
        identifier = env_id(cfg)
        named = f"task={task.name}" + (f" ({identifier})" if identifier else "")
        allowed = f"{allowed}: {named} cannot be filmed here ({why})"
        raise ConfigError(key, value, allowed) from None
    finally:
        env.close()


def _frame(rendered: Any, mode: str) -> np.ndarray:
    if mode == "rgb_array":
        return np.asarray(rendered, dtype=np.uint8)
    # Other envs' text frames (task=gym) may colour with escape codes and vary in width.
    rows = ANSI_ESCAPE.sub("", str(rendered)).rstrip("\n").split("\n")
    width = max(len(row) for row in rows)
    cells = np.array(
        [[COLORS.get(ch, OTHER) for ch in row.ljust(width)] for row in rows], dtype=np.uint8
    )
    return np.kron(cells, np.ones((CELL, CELL, 1), dtype=np.uint8))


def video_suffixes() -> list[str]:
    """The video files rlspeed writes: GIF, and MP4 where imageio-ffmpeg is installed."""
    import importlib.util

    return [".gif"] + ([".mp4"] if importlib.util.find_spec("imageio_ffmpeg") else [])


def write_video(filmed: Film, path: Path) -> Path:
    """Write the video whole or not at all: into a temporary file beside ``path`` (its
    suffix tells imageio the format), renamed over ``path`` once written, so a run killed
    while it writes leaves no part of a video."""
    import imageio.v2 as imageio

    frames: list[Any] = filmed.frames  # imageio's stubs type a frame as anything array-like
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        if path.suffix.lower() == ".gif":
            imageio.mimsave(tmp, frames, duration=1000 / filmed.fps, loop=0)
        else:
            imageio.mimsave(tmp, frames, fps=filmed.fps)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def described(filmed: Film, path: Path) -> str:
    """What a video holds, for its line."""
    cut = f", cut at {MAX_VIDEO_BYTES >> 20} MiB of frames" if filmed.cut else ""
    return f"one greedy episode ({len(filmed.frames)} frames{cut}): {path}"


class VideoSchedule:
    """``video_every=N``: at the first whole iteration that reaches each multiple of N env
    steps, ``film(policy)`` of the training agent's greedy policy, written to
    ``<folder>/step_<env step>.gif`` and logged to the tracker (MLflow, W&B; TensorBoard's
    and none's runs have it in the run folder alone). ``film`` gives the episode or
    why it could not be made (``film_or_why``): a video that cannot be made costs a warning,
    not the run."""

    def __init__(
        self, every: int, folder: Path, film: Callable[[Policy], Film | str], tracker: Tracker
    ) -> None:
        self.every, self.folder, self._film, self._tracker = every, folder, film, tracker
        self._block = 0  # the multiple of ``every`` the last video (or the start) was in
        self.written: list[Path] = []

    def start(self, step: int) -> None:
        """Training starts (or resumes) at env step ``step``."""
        self._block = step // self.every

    def due(self, step: int) -> bool:
        """Whether the agent at env step ``step`` is to be filmed."""
        return step // self.every > self._block

    def record(self, step: int, policy: Policy) -> None:
        """Film ``policy``, the agent's greedy policy at env step ``step`` (when ``due``)."""
        self.keep(step, self._film(policy))

    def keep(self, step: int, filmed: Film | str) -> None:
        """Write ``filmed``, the agent's greedy episode at env step ``step`` (when ``due``;
        a seed worker films it in its process): or warn with why it could not be filmed."""
        self._block = step // self.every
        path = self.folder / f"step_{step}.gif"
        if isinstance(filmed, str):
            log.warning("rlspeed: no video at env step %d: %s", step, filmed)
            return
        try:
            self.folder.mkdir(exist_ok=True)
            write_video(filmed, path)
        except Exception as error:  # noqa: BLE001 - training goes on without this video
            log.warning("rlspeed: no video at env step %d: %s", step, one_line(error))
            return
        self.written.append(path)
        self._tracker.log_artifact(path)
        to_log_file(f"rlspeed: env step {step:,}: {described(filmed, path)}")
