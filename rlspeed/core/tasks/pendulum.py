"""Pendulum: Gymnasium's ``Pendulum-v1``, and a functional JAX twin with the same dynamics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import Policy, TaskSpec, mean_return_on_device

# Gymnasium (and NumPy) load when an env is built or scored, not when a config is checked.
if TYPE_CHECKING:
    import gymnasium as gym

    from rlspeed.core.tasks._episodes import FunctionalTwin

ENV_ID = "Pendulum-v1"


@dataclass(frozen=True)
class PendulumTaskConfig(TaskConfig):
    name: str = "pendulum"
    # The defaults are the standard settings that scores are measured at.
    max_steps: int = 200
    # Greedy episodes behind each score.
    eval_episodes: int = 10


def make_env(cfg: PendulumTaskConfig) -> gym.Env:
    import gymnasium as gym

    return gym.make(ENV_ID, max_episode_steps=cfg.max_steps)


def make_functional(cfg: PendulumTaskConfig) -> FunctionalTwin:
    """Gymnasium's functional JAX Pendulum, whose dynamics already are ``Pendulum-v1``'s.

    Uniform start in [-pi, pi] x [-1, 1], torque clipped to +-2 (action shape (1,)), speed
    clipped to +-8 before the angle update, reward ``-(angle_normalize(th)^2 + 0.1 thdot^2
    + 0.001 u^2)`` of the state before the step, never terminal, observation
    ``(cos th, sin th, thdot)``. Only the precision differs (float32 here, float64 in v1).
    """
    # Imported here: selecting a task must not load JAX and flax; only jax-vmap needs them.
    from gymnasium.envs.classic_control.pendulum import PendulumEnv
    from gymnasium.envs.phys2d.pendulum import PendulumFunctional, PendulumParams

    from rlspeed.core.tasks._episodes import FunctionalTwin

    return FunctionalTwin(PendulumFunctional(), PendulumParams(), PendulumEnv())


def evaluate(cfg: PendulumTaskConfig, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` standard-length episodes."""
    from rlspeed.core.tasks._episodes import mean_greedy_return

    standard = PendulumTaskConfig()
    return mean_greedy_return(lambda: make_env(standard), policy, cfg.eval_episodes, seed)


SPEC = TaskSpec(
    name="pendulum",
    schema=PendulumTaskConfig,
    action_kind="continuous",
    make_env=make_env,
    make_functional=make_functional,
    evaluate=evaluate,
    evaluate_on_device=mean_return_on_device(make_functional, lambda cfg: PendulumTaskConfig()),
    # (cos theta, sin theta, theta_dot) as float32.
    observation_bytes=lambda cfg: 3 * 4,
    network_inputs=lambda cfg: 3,
    truncates_only_at_time_limit=True,
)
