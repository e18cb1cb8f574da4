"""MinAtar through the conv torso: the five games' frames are images (``algo.network=auto``
takes the torso, the checks size it), every stack trains on them, and PPO and DQN learn
Breakout-MinAtar fused with the shipped presets (conf/preset/), cut to tens of seconds.

These need the extra (``pip install "rlspeed[gymnax]"``): they carry the ``gymnax`` marker.
A random policy returns 0.41 on Breakout-MinAtar (1,000 episodes)."""

from __future__ import annotations

import json

import pytest

from rlspeed.core.algos import network_size
from rlspeed.core.algos.networks import torso_size
from rlspeed.errors import ConfigError
from rlspeed.registry import TASKS
from rlspeed.validation import check
from tests.conftest import run_cli

pytestmark = pytest.mark.gymnax

GAMES = [
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "SpaceInvaders-MinAtar",
    "Seaquest-MinAtar",
]
TINY = ["tracking=none", "progress=plain"]
RANDOM_RETURN = 0.41


@pytest.mark.parametrize("game", GAMES)
def test_the_frames_take_the_torso(make_cfg, game):
    """Each game's 10 x 10 x C frames are an image: the torso's 8 x 8 x 16 features feed
    DQN's hidden layers, and the checks size that network (memory, backend.threads=auto);
    with algo.network=mlp the frames are flattened into them."""
    args = ["task=gymnax", f"task.id={game}", "algo=dqn", *TINY]
    cfg = check(make_cfg(args)).cfg
    image = TASKS.get("gymnax").image_shape(cfg.task)
    assert image is not None and image[:2] == (10, 10), image
    torso = torso_size(image)
    assert torso.features == 8 * 8 * 16
    dense = 1024 * 128 + 128 * 128  # the features into DQN's [128, 128]
    assert network_size(cfg) == (
        torso.weights + dense,
        torso.multiply_adds + dense,
        100 * image[2] + torso.features,
    )
    flat = network_size(check(make_cfg([*args, "algo.network=mlp"])).cfg)
    assert flat.weights == 100 * image[2] * 128 + 128 * 128


def test_cnn_on_a_vector_env_is_one_line(make_cfg):
    with pytest.raises(ConfigError) as raised:
        check(make_cfg(["task=gymnax", "task.id=CartPole-v1", "algo.network=cnn", *TINY]))
    message = str(raised.value)
    assert "algo.network=cnn: expected auto or mlp" in message, message
    assert "task.id=CartPole-v1's are no images" in message and "\n" not in message


@pytest.mark.parametrize(
    ("algo", "backend", "engine"),
    [
        ("dqn", "torch", "gym-sync"),
        ("ppo", "torch", "jax-vmap"),  # DLPack
        ("pqn", "flax", "gym-sync"),  # the host learner
        ("vpg", "flax", "jax-vmap"),  # fused
    ],
)
def test_every_stack_trains_on_the_frames(tmp_path, algo, backend, engine):
    run_dir = tmp_path / "run"
    args = ["task=gymnax", "task.id=Breakout-MinAtar", f"algo={algo}", "num_envs=4"]
    stack = [f"backend={backend}", f"env={engine}", *TINY, f"hydra.run.dir={run_dir}"]
    budget = ["total_steps=1024", "log_every=512", "eval_every=1024", "task.eval_episodes=2"]
    if algo == "dqn":
        budget += ["algo.learning_starts=256", "algo.batch_size=32"]
    else:  # on-policy batches of 4 envs x 32 steps
        budget += ["algo.num_steps=32"]
    result = run_cli([*args, *stack, *budget], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["gradient_updates"] > 0


@pytest.mark.parametrize(
    ("preset", "steps"),
    [
        # 20 of the preset's batches (64 envs x 128 steps).
        ("ppo_minatar", 163_840),
        ("dqn_minatar", 60_000),
        # 98 of the preset's batches (64 envs x 32 steps): 5.45 in 28 s (seed 1).
        ("pqn_minatar", 200_704),
    ],
)
def test_the_presets_learn_breakout_fused(tmp_path, preset, steps):
    """Each preset, cut short, well above a random policy (return 0.41)."""
    run_dir = tmp_path / "run"
    args = [f"preset={preset}", "task.id=Breakout-MinAtar", f"hydra.run.dir={run_dir}"]
    budget = [f"total_steps={steps}", f"log_every={steps // 2}", f"eval_every={steps}"]
    result = run_cli([*args, *budget, *TINY], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["recent_return"] >= 5 * RANDOM_RETURN, metrics
