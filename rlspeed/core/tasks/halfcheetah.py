"""HalfCheetah: Gymnasium's ``HalfCheetah-v5`` (MuJoCo), and a JAX twin on MuJoCo MJX."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import Policy, TaskSpec

# Gymnasium (and NumPy) load when an env is built or scored, not when a config is checked.
if TYPE_CHECKING:
    import gymnasium as gym
    from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv

    from rlspeed.core.envs.halfcheetah_mjx import HalfCheetahFunctional

ENV_ID = "HalfCheetah-v5"


@dataclass(frozen=True)
class HalfCheetahTaskConfig(TaskConfig):
    name: str = "halfcheetah"
    # The defaults are the standard settings that scores are measured at.
    max_steps: int = 1000
    # Greedy episodes behind each score.
    eval_episodes: int = 10


def make_env(cfg: HalfCheetahTaskConfig) -> gym.Env:
    import gymnasium as gym

    from rlspeed.core.tasks._mujoco import log_mujoco_warnings

    log_mujoco_warnings()  # MuJoCo 4 warns at every build of this model (stderr, a file)
    return gym.make(ENV_ID, max_episode_steps=cfg.max_steps)


def make_functional(cfg: HalfCheetahTaskConfig) -> HalfCheetahFunctional:
    """``HalfCheetah-v5`` on MJX, with v5's model, frame skip (5), reward (forward speed
    less 0.1 |action|^2), observation (qpos without x, then qvel) and reset noise, read
    from the registered env; never terminal.

    MJX computes in float32 where MuJoCo uses float64. Measured (tests/test_control_tasks.py,
    3 seeds x 16 envs, uniform random actions): from the same state one step differs by
    at most 3.2e-3 in the observation (velocities reach ~10) and 3.3e-5 in the reward, over
    100 steps. Along a trajectory the gaps are at most 6.3e-3 and 2.3e-3 after 10 steps;
    then contacts amplify the rounding and the two trajectories part (0.7-5 apart after 30
    steps), as two float64 v5 runs started 1e-6 apart also do.
    """
    # Imported here: selecting a task must not load JAX and MJX; only jax-vmap needs them.
    from rlspeed.core.envs.halfcheetah_mjx import HalfCheetahFunctional

    env = make_env(cfg)
    # gymnasium types ``unwrapped`` as a plain Env; make_env built HalfCheetah-v5.
    twin = HalfCheetahFunctional(cast("HalfCheetahEnv", env.unwrapped))
    env.close()
    return twin


def evaluate(cfg: HalfCheetahTaskConfig, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` standard-length episodes."""
    from rlspeed.core.tasks._episodes import mean_greedy_return

    standard = HalfCheetahTaskConfig()
    return mean_greedy_return(lambda: make_env(standard), policy, cfg.eval_episodes, seed)


SPEC = TaskSpec(
    name="halfcheetah",
    schema=HalfCheetahTaskConfig,
    action_kind="continuous",
    make_env=make_env,
    make_functional=make_functional,
    # No evaluate_on_device: a fused run scores on v5 itself, on the host; MJX on a CPU
    # steps ten envs far slower than MuJoCo does.
    evaluate=evaluate,
    # 17 joint positions and velocities as float64.
    observation_bytes=lambda cfg: 17 * 8,
    network_inputs=lambda cfg: 17,
    truncates_only_at_time_limit=True,
)
