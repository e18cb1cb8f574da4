"""GridWorld (seed 002): walk from the bottom-right to the top-left corner of a 5x5 grid."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import Policy, TabularSpec, TaskSpec, check_settings

# Gymnasium (and NumPy) load when an env is built or scored, not when a config is checked.
if TYPE_CHECKING:
    from types import ModuleType

    import gymnasium as gym
    import jax

    from rlspeed.core import XpArray

# Greedy evaluation always runs at this episode length, whatever the training length.
STANDARD_MAX_STEPS = 50


@dataclass(frozen=True)
class GridWorldTaskConfig(TaskConfig):
    name: str = "gridworld"
    size: int = 5
    max_steps: int = STANDARD_MAX_STEPS


def make_env(cfg: GridWorldTaskConfig) -> gym.Env:
    import gymnasium as gym

    import rlspeed.core.envs  # noqa: F401  (registers rlspeed/GridWorld-v0)

    return gym.make("rlspeed/GridWorld-v0", size=cfg.size, max_episode_steps=cfg.max_steps)


def make_functional(cfg: GridWorldTaskConfig) -> Any:
    from rlspeed.core.envs.gridworld_jax import GridWorldFunctional

    return GridWorldFunctional(size=cfg.size)


def _greedy_episode(cfg: GridWorldTaskConfig, policy: Policy) -> tuple[list[int], float]:
    """Cells visited by the greedy policy from the start, and the episode's return."""
    import numpy as np

    from rlspeed.core.envs.gridworld import GridWorldEnv

    env = GridWorldEnv(size=cfg.size)
    cell, _ = env.reset()
    cells, total = [cell], 0.0
    for _ in range(STANDARD_MAX_STEPS):
        action = policy(np.array([cell], dtype=np.int32))[0]
        cell, reward, terminated, _, _ = env.step(action)
        cells.append(cell)
        total += reward
        if terminated:
            break
    return cells, total


def greedy_path(cfg: GridWorldTaskConfig, policy: Policy) -> list[int]:
    """Cells the greedy policy visits, start included, until the goal or the time limit."""
    return _greedy_episode(cfg, policy)[0]


def shortest_path_length(cfg: GridWorldTaskConfig) -> int:
    """Moves on a shortest path from the start to the goal: ``2 * (size - 1)``."""
    return 2 * (cfg.size - 1)


def evaluate(cfg: GridWorldTaskConfig, policy: Policy, seed: int) -> float:
    """Return of the greedy policy's episode from the start (1.0 if it reaches the goal
    within the standard time limit). The env is deterministic, so one episode is the mean
    and ``seed`` is not needed."""
    return _greedy_episode(cfg, policy)[1]


def evaluate_on_device(
    cfg: GridWorldTaskConfig, act: Callable[[jax.Array], jax.Array], key: jax.Array
) -> jax.Array:
    """``evaluate`` on the JAX twin: the greedy episode from the start."""
    import jax.numpy as jnp

    from rlspeed.core.envs.vmap import greedy_episodes

    env = make_functional(cfg)
    returns, _ = greedy_episodes(env, jnp.asarray(env.initial())[None], act, STANDARD_MAX_STEPS)
    return returns[0]


def num_states(cfg: GridWorldTaskConfig) -> int:
    return cfg.size * cfg.size


def state_index(cfg: GridWorldTaskConfig, obs: XpArray, xp: ModuleType) -> Any:
    """The observation is the cell index already."""
    return obs.astype(xp.int32)


SPEC = TaskSpec(
    name="gridworld",
    schema=GridWorldTaskConfig,
    action_kind="discrete",
    make_env=make_env,
    make_functional=make_functional,
    evaluate=evaluate,
    evaluate_on_device=evaluate_on_device,
    # The cell index as int32.
    observation_bytes=lambda cfg: 4,
    network_inputs=num_states,  # the cell index, one-hot
    tabular=TabularSpec(num_states=num_states, state_index=state_index),
    # Size 1 would start the agent on the goal.
    validate=lambda cfg: check_settings(cfg, size=2),
    truncates_only_at_time_limit=True,
)
