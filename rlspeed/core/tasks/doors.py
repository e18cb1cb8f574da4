"""Doors (seed 001): cross a walled 15x15 grid through one of three doors to the goal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import Policy, TabularSpec, TaskSpec, check_settings
from rlspeed.errors import ConfigError

# Gymnasium (and NumPy) load when an env is built or scored, not when a config is checked.
if TYPE_CHECKING:
    from types import ModuleType

    import gymnasium as gym
    import jax

    from rlspeed.core import XpArray

# The score is measured at the seed's episode length, whatever the training length.
STANDARD_MAX_STEPS = 32


@dataclass(frozen=True)
class DoorsTaskConfig(TaskConfig):
    name: str = "doors"
    grid_size: int = 15
    n_doors: int = 3
    max_steps: int = STANDARD_MAX_STEPS


def make_env(cfg: DoorsTaskConfig) -> gym.Env:
    import gymnasium as gym

    import rlspeed.core.envs  # noqa: F401  (registers rlspeed/Doors-v0)

    return gym.make(
        "rlspeed/Doors-v0",
        grid_size=cfg.grid_size,
        n_doors=cfg.n_doors,
        max_episode_steps=cfg.max_steps,
    )


def make_functional(cfg: DoorsTaskConfig) -> Any:
    from rlspeed.core.envs.doors_jax import DoorsFunctional

    return DoorsFunctional(grid_size=cfg.grid_size, n_doors=cfg.n_doors)


def validate(cfg: DoorsTaskConfig) -> None:
    """A middle wall row between the start and goal rows (grid_size >= 3) with 1 to
    grid_size doors in it."""
    check_settings(cfg, grid_size=3, n_doors=1)
    if cfg.n_doors > cfg.grid_size:
        raise ConfigError(
            "task.n_doors", cfg.n_doors, f"an integer in [1, task.grid_size] = [1, {cfg.grid_size}]"
        )


def evaluate(cfg: DoorsTaskConfig, policy: Policy, seed: int) -> float:
    """Step reward ratio of the greedy policy over every start column: the exact
    expectation over the uniform start, so the score has no sampling noise."""
    import numpy as np

    from rlspeed.core.envs.doors import DoorsEnv

    width = cfg.grid_size
    envs = [DoorsEnv(grid_size=cfg.grid_size, n_doors=cfg.n_doors) for _ in range(width)]
    # Every start is given and the dynamics are deterministic: no seed is needed.
    obs = np.stack([env.reset(options={"start_col": c})[0] for c, env in enumerate(envs)])
    active = np.ones(width, dtype=bool)
    total_reward, total_steps = 0.0, 0
    for _ in range(STANDARD_MAX_STEPS):
        actions = policy(obs)
        for i in np.flatnonzero(active):
            obs[i], reward, terminated, _, _ = envs[i].step(int(actions[i]))
            total_reward += float(reward)
            total_steps += 1
            active[i] = not terminated
        if not active.any():
            break
    return total_reward / total_steps


def evaluate_on_device(
    cfg: DoorsTaskConfig, act: Callable[[jax.Array], jax.Array], key: jax.Array
) -> jax.Array:
    """``evaluate`` on the JAX twin: every start column's greedy episode at once (float32
    rewards, where the host sums float64)."""
    import jax.numpy as jnp

    from rlspeed.core.envs.vmap import greedy_episodes

    env = make_functional(cfg)
    starts = env.state_from_start_column(jnp.arange(cfg.grid_size))
    returns, lengths = greedy_episodes(env, starts, act, STANDARD_MAX_STEPS)
    return returns.sum() / lengths.sum()


def network_inputs(cfg: DoorsTaskConfig) -> int:
    """Every cell's code, one-hot."""
    from rlspeed.core.envs.doors import N_CELL_TYPES

    return cfg.grid_size**2 * N_CELL_TYPES


def num_states(cfg: DoorsTaskConfig) -> int:
    """Agent cell x goal column: ``H * W * W``."""
    return cfg.grid_size**3


def state_index(cfg: DoorsTaskConfig, obs: XpArray, xp: ModuleType) -> Any:
    """``agent_cell * W + goal_col`` from flattened observations ``[B, H*W]``.

    The goal sits in the top row, which holds no wall, so that row's largest code marks
    the goal column (GOAL=3 beats AGENT=1). On the terminal observation the agent hides
    the goal, and then the top row's only non-empty cell is the agent, on the goal column.
    """
    from rlspeed.core.envs.doors import AGENT

    width = cfg.grid_size
    agent_cell = xp.argmax(obs == AGENT, axis=-1)
    goal_col = xp.argmax(obs[..., :width], axis=-1)
    return (agent_cell * width + goal_col).astype(xp.int32)


SPEC = TaskSpec(
    name="doors",
    schema=DoorsTaskConfig,
    action_kind="discrete",
    make_env=make_env,
    make_functional=make_functional,
    evaluate=evaluate,
    evaluate_on_device=evaluate_on_device,
    # The flattened grid, one int8 cell code per cell.
    observation_bytes=lambda cfg: cfg.grid_size**2,
    network_inputs=network_inputs,
    tabular=TabularSpec(num_states=num_states, state_index=state_index),
    validate=validate,
    step_reward=True,
    truncates_only_at_time_limit=True,
)
