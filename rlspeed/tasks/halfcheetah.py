"""HalfCheetah: Gymnasium's ``HalfCheetah-v5`` (MuJoCo); Gymnasium engines only."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlspeed.config import TaskConfig
from rlspeed.tasks import Policy, TaskSpec

# Gymnasium (and NumPy) load when an env is built or scored, not when a config is checked.
if TYPE_CHECKING:
    import gymnasium as gym
    from omegaconf import DictConfig

ENV_ID = "HalfCheetah-v5"

log = logging.getLogger(__name__)


@dataclass
class HalfCheetahTaskConfig(TaskConfig):
    name: str = "halfcheetah"
    # The defaults are the standard settings that scores are measured at.
    max_steps: int = 1000
    # Greedy episodes behind each score.
    eval_episodes: int = 10


@functools.cache
def _log_mujoco_warning(message: str) -> None:
    # Cached: each distinct message is logged once per process, not once per env built.
    log.warning("MuJoCo: %s", message)


def make_env(cfg: HalfCheetahTaskConfig | DictConfig) -> gym.Env:
    import gymnasium as gym
    import mujoco

    # MuJoCo's own handler prints to stderr and appends to MUJOCO_LOG.TXT in the working
    # directory; MuJoCo 4 warns there at every build of Gymnasium's HalfCheetah model (a
    # deprecated XML attribute). The handler must not raise: it is called from C.
    mujoco.set_mju_user_warning(_log_mujoco_warning)
    return gym.make(ENV_ID, max_episode_steps=cfg.max_steps)


def evaluate(cfg: HalfCheetahTaskConfig | DictConfig, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` standard-length episodes."""
    from rlspeed.tasks._episodes import mean_greedy_return

    standard = HalfCheetahTaskConfig()
    return mean_greedy_return(lambda: make_env(standard), policy, cfg.eval_episodes, seed)


SPEC = TaskSpec(
    name="halfcheetah",
    schema=HalfCheetahTaskConfig,
    action_kind="continuous",
    make_env=make_env,
    # No JAX version yet: config validation rejects env=jax-vmap with one line.
    make_functional=None,
    evaluate=evaluate,
    # 17 joint positions and velocities as float64.
    observation_bytes=lambda cfg: 17 * 8,
    network_inputs=lambda cfg: 17,
)
