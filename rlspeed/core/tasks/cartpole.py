"""CartPole: Gymnasium's ``CartPole-v1``, and a functional JAX twin with the same dynamics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import Policy, TaskSpec, mean_return_on_device

# Gymnasium (and NumPy) load when an env is built or scored, not when a config is checked.
if TYPE_CHECKING:
    import gymnasium as gym

    from rlspeed.core.tasks._episodes import FunctionalTwin

ENV_ID = "CartPole-v1"


@dataclass(frozen=True)
class CartPoleTaskConfig(TaskConfig):
    name: str = "cartpole"
    # The defaults are the standard settings that scores are measured at.
    max_steps: int = 500
    # Greedy episodes behind each score.
    eval_episodes: int = 10


def make_env(cfg: CartPoleTaskConfig) -> gym.Env:
    import gymnasium as gym

    return gym.make(ENV_ID, max_episode_steps=cfg.max_steps)


def make_functional(cfg: CartPoleTaskConfig) -> FunctionalTwin:
    """Gymnasium's functional JAX CartPole with ``CartPole-v1``'s parameters.

    Gymnasium's default ``CartPoleParams.polemass_length`` is ``masspole + length`` (0.6)
    where v1 has ``masspole * length`` (0.05): a different pole. The rest is v1's: uniform
    start in [-0.05, 0.05]^4, explicit Euler with tau 0.02, a +-10 N push, reward 1 on
    every step including the terminating one, termination beyond |x| 2.4 or |theta| 12
    degrees, observation = state. Only the precision differs (float32 here, float64 in v1).
    """
    # Imported here: selecting a task must not load JAX and flax; only jax-vmap needs them.
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv
    from gymnasium.envs.phys2d.cartpole import CartPoleFunctional, CartPoleParams

    from rlspeed.core.tasks._episodes import FunctionalTwin

    v1 = CartPoleEnv()
    params = CartPoleParams(polemass_length=v1.polemass_length)
    return FunctionalTwin(CartPoleFunctional(), params, v1)


def evaluate(cfg: CartPoleTaskConfig, policy: Policy, seed: int) -> float:
    """Mean return of the greedy policy over ``cfg.eval_episodes`` standard-length episodes."""
    from rlspeed.core.tasks._episodes import mean_greedy_return

    standard = CartPoleTaskConfig()
    return mean_greedy_return(lambda: make_env(standard), policy, cfg.eval_episodes, seed)


SPEC = TaskSpec(
    name="cartpole",
    schema=CartPoleTaskConfig,
    action_kind="discrete",
    make_env=make_env,
    make_functional=make_functional,
    evaluate=evaluate,
    evaluate_on_device=mean_return_on_device(make_functional, lambda cfg: CartPoleTaskConfig()),
    # (x, x_dot, theta, theta_dot) as float32.
    observation_bytes=lambda cfg: 4 * 4,
    network_inputs=lambda cfg: 4,
    truncates_only_at_time_limit=True,
)
