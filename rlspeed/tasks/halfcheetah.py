"""HalfCheetah: Gymnasium's ``HalfCheetah-v5`` (MuJoCo); Gymnasium engines only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rlspeed.config import TaskConfig
from rlspeed.tasks import Policy, TaskSpec
from rlspeed.tasks.episodes import mean_greedy_return

ENV_ID = "HalfCheetah-v5"
# The score is measured at the registered episode length, whatever the training length.
STANDARD_MAX_STEPS = 1000


@dataclass
class HalfCheetahTaskConfig(TaskConfig):
    name: str = "halfcheetah"
    max_steps: int = STANDARD_MAX_STEPS
    # Greedy episodes behind each score.
    eval_episodes: int = 10


def make_env(cfg: Any) -> gym.Env:
    return gym.make(ENV_ID, max_episode_steps=cfg.max_steps)


def evaluate(cfg: Any, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` standard-length episodes."""
    return mean_greedy_return(
        lambda: gym.make(ENV_ID, max_episode_steps=STANDARD_MAX_STEPS),
        policy,
        cfg.eval_episodes,
        seed,
    )


SPEC = TaskSpec(
    name="halfcheetah",
    schema=HalfCheetahTaskConfig,
    action_kind="continuous",
    make_env=make_env,
    # No JAX version yet: config validation rejects env=jax-vmap with one line.
    make_functional=None,
    evaluate=evaluate,
)
