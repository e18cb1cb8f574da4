"""``dmc``: PPO on MuJoCo Playground's DM Control suite, fused, for a whole training budget,
against a uniformly random policy's return on the same tasks.

Each row is one ``rlspeed`` command (``task=playground``, flax + jax-vmap, PPO's shipped
settings for the suite, ``conf/algo_task/ppo_playground.yaml``) in a fresh process: its
greedy score (the mean return of ``task.eval_episodes`` episodes of 1,000 steps, scored on
the env's JAX twin inside the program), the mean return of its last 20 training episodes,
and its whole-process time. The random policy's return comes from 64 episodes of uniform
actions in the action box, stepped by the same twin.

Needs the playground extra (``pip install "rlspeed[playground]"``).
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, paired_bars, run_rlspeed, write_results

NEEDS_PLAYGROUND = (
    'rlspeed-bench dmc needs the playground extra (pip install "rlspeed[playground]"):'
    " its runs are of task=playground"
)
# The suite's episodes: 1,000 control steps, what every score is measured at.
EPISODE_STEPS = 1000
RANDOM_EPISODES = 64
# (task id, env steps of the full run): whole batches of PPO's 16 envs x 128 steps.
FULL = (("CartpoleBalance", 1_003_520), ("CartpoleSwingup", 2_007_040), ("ReacherEasy", 1_003_520))
QUICK = (("CartpoleBalance", 20_480),)
COLUMNS = [
    "task",
    "env_steps",
    "random_return",
    "random_std",
    "score",
    "recent_return",
    "x_random",
    "wall_s",
    "env_steps_per_s",
]


def playground_problem() -> str | None:
    """One line when MuJoCo Playground is not installed."""
    return None if importlib.util.find_spec("mujoco_playground") else NEEDS_PLAYGROUND


def random_returns(compose: Any, env_id: str, episodes: int, seed: int = 0) -> Any:
    """Returns of ``episodes`` episodes of uniformly random actions on ``env_id``'s twin,
    each from its own start state, to its end or ``EPISODE_STEPS``."""
    import gymnasium as gym
    import jax
    import jax.numpy as jnp

    from rlspeed.core.envs.vmap import make_vmap_env
    from rlspeed.registry import TASKS

    task_cfg = compose(["task=playground", f"task.id={env_id}", f"task.max_steps={EPISODE_STEPS}"])
    env = make_vmap_env(TASKS.get("playground"), task_cfg.task, episodes)
    space = env.single_action_space
    assert isinstance(space, gym.spaces.Box)  # the suite's actions: a box of torques
    low, high = jnp.asarray(space.low), jnp.asarray(space.high)

    @jax.jit
    def play(key: jax.Array) -> jax.Array:
        start_key, action_key = jax.random.split(key)

        def step(carry: tuple[Any, ...], step_key: jax.Array) -> tuple[tuple[Any, ...], None]:
            state, returns, ended = carry
            shape = (episodes, *low.shape)
            actions = jax.random.uniform(step_key, shape, minval=low, maxval=high)
            state, result = env.step(state, actions)
            done = result.terminated | result.truncated
            # Each env's first episode: the auto-reset one after it is not counted.
            returns = jnp.where(done & ~ended, result.episode_return, returns)
            return (state, returns, ended | done), None

        keys = jax.random.split(action_key, EPISODE_STEPS)
        start = (env.init(start_key), jnp.zeros(episodes), jnp.zeros(episodes, dtype=bool))
        (_, returns, _), _ = jax.lax.scan(step, start, keys)
        return returns

    return jax.device_get(play(jax.random.key(seed)))


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    table = Table(
        "dmc",
        "PPO on MuJoCo Playground's DM Control suite, fused (flax + jax-vmap), against a"
        " random policy",
        COLUMNS,
        notes=[
            "score: the greedy mean return over the run's evaluation episodes (task.eval_"
            "episodes, 10), 1,000 steps each, scored on the env's JAX twin inside the"
            " program; recent_return: the mean of the last 20 training episodes.",
            f"random_return: the mean (random_std: the standard deviation) of {RANDOM_EPISODES}"
            " episodes of uniform actions in the action box on the same twin; x_random:"
            " score / random_return.",
            "wall_s: the whole process, from its start to its exit (imports, compiling,"
            " training, evaluations, files; tracking off); env_steps_per_s: env_steps / wall_s.",
            "Settings: conf/algo_task/ppo_playground.yaml (16 envs x 128 steps, 10 epochs of"
            " 32 minibatches, step size 3e-4, observation normalisation, reward scaling).",
        ],
    )
    for env_id, steps in QUICK if quick else FULL:
        overrides = [
            "task=playground",
            f"task.id={env_id}",
            "algo=ppo",
            "backend=flax",
            "env=jax-vmap",
            "seed=1",
            f"total_steps={steps}",
            f"eval_every={steps}",
        ]
        table.configs.append("rlspeed " + " ".join(overrides))
        returns = random_returns(compose, env_id, RANDOM_EPISODES)
        with tempfile.TemporaryDirectory(prefix="rlspeed-bench-dmc-") as folder:
            started = time.perf_counter()
            metrics = run_rlspeed(overrides, Path(folder) / "run")
            wall_s = time.perf_counter() - started
        random_return = float(returns.mean())
        table.add(
            task=env_id,
            env_steps=int(metrics["env_steps"]),
            random_return=random_return,
            random_std=float(returns.std()),
            score=float(metrics["score"]),
            recent_return=float(metrics["recent_return"]),
            x_random=float(metrics["score"]) / random_return,
            wall_s=wall_s,
            env_steps_per_s=int(metrics["env_steps"]) / wall_s,
        )
    return write_results(table, out_dir, _plot)


def _plot(table: Table, ax: Any) -> None:
    """The greedy score against the random policy's return, per task."""
    paired_bars(
        ax,
        [row["task"] for row in table.rows],
        ("random policy", [r["random_return"] for r in table.rows]),
        ("rlspeed PPO, fused", [r["score"] for r in table.rows]),
    )
    ax.set_ylabel(f"mean return over {EPISODE_STEPS:,} steps")
    ax.legend(fontsize=8)
