"""Videos of greedy episodes (``rlspeed.video``): ``video_every=N`` films the training agent
into the run folder and its MLflow run; ``mode=eval video=`` writes a relative path into the
eval's folder; a MuJoCo env films without a display and without MUJOCO_GL, and where MuJoCo
cannot draw the command is one line saying what to install."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import mlflow
import numpy as np
import pytest

from rlspeed.machine import GL_PACKAGES, HEADLESS_GL, headless_gl
from tests.conftest import (
    RLSPEED,
    assert_one_line_error,
    headless_env,
    run_cli,
    run_in,
)

# Q-learning on the 5 x 5 GridWorld: solved within 2,000 steps, filmed from its text frames.
GRIDWORLD = [
    "task=gridworld", "algo=qlearn", "num_envs=1", "total_steps=2000", "log_every=500",
    "eval_every=1000", "progress=plain",
]  # fmt: skip
# Gymnasium's smallest MuJoCo env, a few short episodes.
PENDULUM = [
    "task=gym", "task.id=InvertedPendulum-v5", "task.max_steps=30", "algo=ppo", "backend=torch",
    "env=gym-sync", "num_envs=1", "algo.num_steps=64", "total_steps=128", "log_every=64",
    "eval_every=128", "progress=plain", "tracking=none",
]  # fmt: skip


def _steps(folder: Path) -> list[int]:
    """The env steps of a run's videos, from their names (step_<n>.gif)."""
    names = [path.name for path in folder.iterdir()]
    assert all(name.startswith("step_") and name.endswith(".gif") for name in names), names
    return sorted(int(name.removeprefix("step_").removesuffix(".gif")) for name in names)


def _frames(path: Path) -> list[np.ndarray]:
    assert path.read_bytes().startswith(b"GIF8")
    return imageio.mimread(path)


FUSED, HOST = ("flax", "jax-vmap"), ("torch", "gym-sync")


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "env"), [FUSED, HOST])
def test_video_every_films_the_agent_as_it_trains_and_eval_films_into_its_folder(
    tmp_path, monkeypatch, capsys, make_cfg, backend, env
):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*GRIDWORLD, f"backend={backend}", f"env={env}", "video_every=1000"]
    run = tmp_path / "run"
    metrics = run_in(run, monkeypatch, make_cfg([*args, f"tracking.uri={uri}"]))
    # One video at the first whole iteration that reaches each multiple of 1,000 env steps,
    # in the folder the summary names.
    steps = _steps(run / "videos")
    summary = rf"^videos +{re.escape(str((run / 'videos').resolve()))}$"
    assert re.search(summary, capsys.readouterr().out, re.MULTILINE)
    assert len(steps) == 2 and 1000 <= steps[0] < 2000 <= steps[1], steps
    assert metrics["score"] == 1.0  # solved: the last video walks the shortest path
    walk = _frames(run / "videos" / f"step_{steps[1]}.gif")
    assert len(walk) == 1 + 8  # the start and 8 moves, corner to corner
    assert all(frame.shape == walk[0].shape for frame in walk)
    # MLflow has them in the same folder, as they were written.
    client = mlflow.tracking.MlflowClient(uri)
    (tracked,) = client.search_runs([client.get_experiment_by_name("rlspeed").experiment_id])
    listed = [artifact.path for artifact in client.list_artifacts(tracked.info.run_id, "videos")]
    assert sorted(listed) == sorted(f"videos/step_{step}.gif" for step in steps)

    # mode=eval: a relative video= lands in the eval's own folder, not the working folder.
    evaluated = run_cli(
        ["mode=eval", "checkpoint=run", "video=episode.gif", "hydra.run.dir=eval"], tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    video = tmp_path / "eval" / "episode.gif"
    assert f"(9 frames): {video.resolve()}" in evaluated.stdout
    assert len(_frames(video)) == 9 and not (tmp_path / "episode.gif").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MUJOCO_GL=glfw draws on a Mac")
def test_mujoco_that_cannot_draw_here_is_one_line_saying_what_to_install(tmp_path):
    """MUJOCO_GL as the user set it (GLFW, which needs a display) stays; MuJoCo draws no frame,
    and the command says so in one line before anything is created."""
    refused = subprocess.run(
        [RLSPEED, *PENDULUM, "video_every=64"], cwd=tmp_path, env=headless_env(MUJOCO_GL="glfw"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert_one_line_error(
        refused,
        "invalid video_every=64: expected 0 (off): task=gym (InvertedPendulum-v5) cannot be "
        "filmed here (MuJoCo drew no frame with MUJOCO_GL=glfw (",
        f"which rlspeed picks when MUJOCO_GL is unset and its library loads: on Debian or "
        f"Ubuntu {GL_PACKAGES})",
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(
    headless_gl() is None,
    reason=f"none of {', '.join(sum(HEADLESS_GL.values(), ()))} loads here ({GL_PACKAGES})",
)
def test_a_mujoco_env_films_without_a_display_or_mujoco_gl(tmp_path):
    """The issue's case: MuJoCo filmed with nothing set up, while training and in mode=eval."""
    env = headless_env()
    trained = subprocess.run(
        [RLSPEED, *PENDULUM, "video_every=64", "hydra.run.dir=run"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert _steps(tmp_path / "run" / "videos") == [64, 128]
    evaluated = subprocess.run(
        [RLSPEED, "mode=eval", "checkpoint=run", "video=clip.gif", "hydra.run.dir=eval"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "Traceback" not in evaluated.stderr
    for video in [tmp_path / "run" / "videos" / "step_128.gif", tmp_path / "eval" / "clip.gif"]:
        frames = _frames(video)
        # Gymnasium's 480 x 480 camera, drawn: the pole and cart on a dark floor, not blank.
        assert 2 <= len(frames) <= 31 and frames[0].shape == (480, 480, 3)
        assert frames[0].std() > 10


def test_a_video_is_written_whole_or_not_at_all(tmp_path):
    """The frames go to a temporary file renamed over the video once written: a video
    that cannot be encoded leaves neither the video nor a part of it."""
    from rlspeed.video import Film, write_video

    frames = [np.full((8, 8, 3), shade, dtype=np.uint8) for shade in (0, 128, 255)]
    path = write_video(Film(frames, fps=10, cut=False), tmp_path / "step_100.gif")
    assert len(imageio.mimread(path)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_100.gif"]
    mixed = [frames[0], np.zeros((3, 5), dtype=np.float64)]  # frames of two sizes and kinds
    with pytest.raises(Exception):  # noqa: B017 - whatever imageio raises for such frames
        write_video(Film(mixed, fps=10, cut=False), tmp_path / "step_200.gif")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_100.gif"]
