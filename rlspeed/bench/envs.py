"""``envs``: environment steps/s against ``num_envs`` for every way rlspeed steps a task.

Random actions, no learning: this is the engine's own cost. Four modes per task:
``gym-sync`` and ``gym-async`` (Gymnasium vector envs stepped from Python), ``jax-vmap``
(the jitted vmapped step called once per vector step from Python, as torch+jax-vmap does)
and ``jax-fused`` (the same step inside one compiled ``lax.scan``, as the fused path runs
it). Every mode cycles through the same kind of 64 pre-drawn rows of random actions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from rlspeed.bench.common import Table, calls_per_second, write_results
from rlspeed.core.envs.vmap import make_vmap_env
from rlspeed.registry import ENGINES, TASKS

if TYPE_CHECKING:
    from omegaconf import DictConfig

MODES = ("gym-sync", "gym-async", "jax-vmap", "jax-fused")
# One OS process per env: beyond this the machine thrashes long before it measures anything.
ASYNC_MAX_ENVS = 64
COLUMNS = ["task", "mode", "num_envs", "env_steps_per_s", "x_gym_sync"]
# Env steps per compiled call of jax-fused, where a task's step is too slow for the default.
CALL_ENV_STEPS = {"halfcheetah": 2048}


def _make_engine(cfg: DictConfig, num_envs: int) -> Any:
    task = TASKS.get(cfg.task.name)
    engine = ENGINES.get(cfg.env.name).make(task, cfg.task, cfg.env, num_envs, 0)
    engine.reset()
    return engine


def _action_rows(space: Any, num_envs: int) -> np.ndarray:
    """64 rows of ``num_envs`` random actions: uniform over a Discrete space's actions or
    within a Box's bounds."""
    rng = np.random.default_rng(0)
    if hasattr(space, "n"):
        return rng.integers(0, int(space.n), size=(64, num_envs))
    return rng.uniform(space.low, space.high, (64, num_envs, *space.shape)).astype(space.dtype)


def _gym_rate(cfg: DictConfig, num_envs: int, budget_s: float) -> float:
    engine = _make_engine(cfg, num_envs)
    actions = _action_rows(engine.single_action_space, num_envs)
    counter = iter(range(1 << 62))

    def block() -> None:
        engine.step(actions[next(counter) % len(actions)])

    try:
        return num_envs * calls_per_second(block, budget_s)
    finally:
        engine.close()


def _vmap_rate(cfg: DictConfig, num_envs: int, budget_s: float) -> float:
    engine = _make_engine(cfg, num_envs)
    actions = jnp.asarray(_action_rows(engine.single_action_space, num_envs))
    counter = iter(range(1 << 62))

    def block() -> None:
        result = engine.step(actions[next(counter) % 64])
        result.reward.block_until_ready()

    return num_envs * calls_per_second(block, budget_s)


def _fused_rate(cfg: DictConfig, num_envs: int, budget_s: float) -> float:
    env = make_vmap_env(TASKS.get(cfg.task.name), cfg.task, num_envs)
    # Long enough per call that dispatch is negligible, short enough that one call takes
    # seconds at most (an MJX step costs a thousand times a CartPole one).
    work = CALL_ENV_STEPS.get(cfg.task.name, 262_144)
    length = max(16, min(4096, work // num_envs))

    # The same 64 pre-drawn action rows as the Gymnasium modes cycle through, so no mode
    # pays for drawing actions.
    actions = jnp.asarray(_action_rows(env.single_action_space, num_envs))

    @jax.jit
    def run(state: Any) -> Any:
        def body(state: Any, t: jax.Array) -> tuple[Any, jax.Array]:
            state, result = env.step(state, actions[t % 64])
            return state, result.reward.sum()

        state, rewards = jax.lax.scan(body, state, jnp.arange(length))
        return state, rewards.sum()

    state = [env.init(jax.random.key(0))]

    def block() -> None:
        state[0], total = run(state[0])
        jnp.asarray(total).block_until_ready()

    return num_envs * length * calls_per_second(block, budget_s)


def measure(
    mode: str,
    task_name: str,
    compose: Any,
    num_envs: int,
    budget_s: float,
    task_overrides: list[str] | None = None,
) -> float:
    """Env steps/s of ``task_name`` (the task ``task_overrides`` compose, if given) stepped
    ``mode``'s way, ``num_envs`` wide."""
    engine = "jax-vmap" if mode == "jax-fused" else mode
    cfg = compose([*(task_overrides or [f"task={task_name}"]), f"env={engine}"])
    rates = {"gym-sync": _gym_rate, "gym-async": _gym_rate, "jax-vmap": _vmap_rate}
    return rates.get(mode, _fused_rate)(cfg, num_envs, budget_s)


def rates_table(
    table: Table,
    compose: Any,
    modes: tuple[str, ...],
    env_counts: tuple[int, ...],
    budget_s: float,
    max_envs: dict[str, int],
    tasks: tuple[str, ...] = ("doors", "cartpole"),
    task_overrides: dict[str, list[str]] | None = None,
) -> Table:
    """Fill ``table`` with env steps/s of each of ``tasks`` for each of ``modes`` at each
    of ``env_counts`` (a mode stops at its ``max_envs``); ``x_gym_sync`` divides by
    gym-sync's rate at the widest count it ran up to this one. ``task_overrides``: the
    overrides that compose a task named in ``tasks`` (default ``task=<name>``)."""
    for task_name in tasks:
        overrides = (task_overrides or {}).get(task_name, [f"task={task_name}"])
        task_cfg = compose(overrides).task
        table.configs.append(f"{' '.join(overrides)}: {dict(task_cfg)}")
        baseline = float("nan")
        for num_envs in env_counts:
            for mode in modes:
                if num_envs > max_envs.get(mode, num_envs):
                    continue
                rate = measure(mode, task_name, compose, num_envs, budget_s, overrides)
                if mode == "gym-sync":
                    baseline = rate
                table.add(
                    task=task_name,
                    mode=mode,
                    num_envs=num_envs,
                    env_steps_per_s=rate,
                    x_gym_sync=rate / baseline,
                )
    return table


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    env_counts = (1, 8) if quick else (1, 8, 64, 512, 4096)
    budget_s = 0.05 if quick else 1.5
    table = Table(
        "envs",
        "Environment steps/s against num_envs (random actions, no learning)",
        COLUMNS,
        notes=[
            f"gym-async runs one process per env and stops at {ASYNC_MAX_ENVS} envs.",
            "jax-fused: the vmapped step inside one jitted lax.scan (compile time excluded);"
            " jax-vmap: the same step jitted, called once per vector step from Python.",
            "x_gym_sync: env steps/s divided by gym-sync's at the same task and num_envs.",
            f"Each figure: at least {budget_s} s of stepping after one warm-up call.",
        ],
    )
    rates_table(table, compose, MODES, env_counts, budget_s, {"gym-async": ASYNC_MAX_ENVS})
    return write_results(table, out_dir, plot_rates)


def plot_rates(table: Table, ax: Any) -> None:
    """env steps/s against num_envs, a line per (task, mode), on log scales."""
    lines = ("-", "--", ":", "-.")
    for index, task_name in enumerate(dict.fromkeys(r["task"] for r in table.rows)):
        for color, mode in enumerate(MODES):
            rows = [r for r in table.rows if r["task"] == task_name and r["mode"] == mode]
            if rows:
                ax.plot(
                    [r["num_envs"] for r in rows],
                    [r["env_steps_per_s"] for r in rows],
                    lines[index % len(lines)],
                    color=f"C{color}",
                    marker="o",
                    label=f"{task_name} {mode}",
                )
    counts = sorted({r["num_envs"] for r in table.rows})
    ax.set_xscale("log")
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("num_envs")
    ax.set_ylabel("env steps / s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
