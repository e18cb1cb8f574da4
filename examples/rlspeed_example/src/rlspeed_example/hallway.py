"""``task=hallway``: walk to the end of a hallway (``hallway_env.HallwayEnv``).

A task is a ``TaskSpec``: its settings (a dataclass extending rlspeed's ``TaskConfig``; they
become ``task.*`` on the command line), how to build its Gymnasium env and how to score a
greedy policy. Gymnasium is imported only when an env is built, so checking a command line
stays fast. The observation is the cell, so the task also has a tabular form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import Policy, TabularSpec, TaskSpec, check_settings


@dataclass(frozen=True)
class HallwayConfig(TaskConfig):
    name: str = "hallway"
    # Cells from the start to the goal, both included.
    length: int = 6
    max_steps: int = 50


def make_env(cfg: Any) -> Any:
    from gymnasium.wrappers import TimeLimit

    from rlspeed_example.hallway_env import HallwayEnv

    return TimeLimit(HallwayEnv(cfg.length), max_episode_steps=cfg.max_steps)


def evaluate(cfg: Any, policy: Policy, seed: int) -> float:
    """1.0 if the greedy policy reaches the goal within ``max_steps``, else 0.0 (the env
    is deterministic: one episode says it)."""
    import numpy as np

    env = make_env(cfg)
    cell, _ = env.reset(seed=seed)
    while True:
        cell, reward, terminated, truncated, _ = env.step(policy(np.array([cell]))[0])
        if terminated or truncated:
            return float(reward)


SPEC = TaskSpec(
    name="hallway",
    schema=HallwayConfig,
    action_kind="discrete",
    make_env=make_env,
    make_functional=None,  # no JAX twin: env=jax-vmap is refused in one line
    evaluate=evaluate,
    observation_bytes=lambda cfg: 8,  # the cell, an int64
    network_inputs=lambda cfg: cfg.length,  # the cell, one-hot
    tabular=TabularSpec(
        num_states=lambda cfg: cfg.length,
        state_index=lambda cfg, obs, xp: obs.astype(xp.int32),
    ),
    validate=lambda cfg: check_settings(cfg, length=2),
    truncates_only_at_time_limit=True,
)
