"""``updates``: the time of one update step, flax against torch, across batch sizes: TD3
and VPG on HalfCheetah's spaces (17-dim observations, 6-dim actions) as in seed 003, and
DQN on Doors' (225 cells, one-hot encoded: the update that dominates ``table2``).

Each backend's own host-loop learner is timed on the same NumPy batch, as the
Gymnasium engines hand it over: torch wraps it without a copy, jax transfers it into its
jitted update. One TD3 update is the mean over an even number of calls, so half of them
include the delayed actor and target step; one VPG update is one policy step plus
``value_iterations`` value steps; one DQN update is one gradient step on a replay batch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import gymnasium as gym
import jax
import numpy as np
import torch
from omegaconf import OmegaConf

from rlspeed.bench.common import Table, calls_per_second, write_results
from rlspeed.core.algos.replay import Batch
from rlspeed.core.algos.rollout import RolloutBatch

HALFCHEETAH = (
    gym.spaces.Box(-np.inf, np.inf, (17,), np.float32),
    gym.spaces.Box(-1.0, 1.0, (6,), np.float32),
)
DOORS = (gym.spaces.MultiDiscrete(np.full(15 * 15, 4), dtype=np.int8), gym.spaces.Discrete(5))
# algo -> (task its config comes from, its spaces, batch sizes, quick batch sizes)
CASES = {
    "td3": ("halfcheetah", HALFCHEETAH, (64, 256, 1024, 4096), (64, 256)),
    "vpg": ("halfcheetah", HALFCHEETAH, (256, 1024, 4096, 16384), (256, 1024)),
    "dqn": ("doors", DOORS, (32, 128, 512, 2048), (128,)),
}


def _batch(algo: str, size: int, rng: np.random.Generator) -> Any:
    obs_space, action_space = CASES[algo][1]
    rewards = rng.standard_normal(size, dtype=np.float32)
    if algo == "dqn":
        assert isinstance(obs_space, gym.spaces.MultiDiscrete)
        assert isinstance(action_space, gym.spaces.Discrete)
        obs, next_obs = rng.integers(0, 4, (2, size, obs_space.shape[0])).astype(np.int8)
        actions = rng.integers(0, action_space.n, size)
        return Batch(obs, next_obs, actions, rewards, np.zeros(size, np.float32))
    assert isinstance(obs_space, gym.spaces.Box) and isinstance(action_space, gym.spaces.Box)
    obs, next_obs = rng.standard_normal((2, size, *obs_space.shape), dtype=np.float32)
    actions = rng.uniform(-1, 1, (size, *action_space.shape)).astype(np.float32)
    if algo == "td3":
        return Batch(obs, next_obs, actions, rewards, np.zeros(size, np.float32))
    return RolloutBatch(obs, actions, rewards, rewards, rewards, rewards + 1.0)


def _sync(result: Any, learner: Any) -> None:
    """Wait for the work queued by a JAX learner (torch on CPU is already done)."""
    agent = getattr(learner, "agent", None)
    if agent is not None:
        jax.block_until_ready((agent, result))


def time_update(algo: str, backend: str, run_cfg: Any, size: int, budget_s: float) -> float:
    """Seconds per update step after warm-up (which includes compilation); ``run_cfg``:
    the composed config whose ``algo``, ``backend`` (torch's device) and ``task`` (a replay
    buffer's longest episode) the learner reads."""
    module = importlib.import_module(f"rlspeed.core.algos.{algo}.{backend}")
    learner_cls = module.TorchLearner if backend == "torch" else module.FlaxLearner
    cfg = OmegaConf.create(
        {
            "algo": run_cfg.algo,
            "backend": run_cfg.backend,
            "task": run_cfg.task,
            "total_steps": 10**9,
            "num_envs": 1,
        }
    )
    learner = learner_cls(*CASES[algo][1], cfg, 0)
    batch = _batch(algo, size, np.random.default_rng(0))

    def two_updates() -> None:
        # Pairs, so a TD3 figure averages critic-only and critic + delayed actor updates.
        learner.update(batch)
        _sync(learner.update(batch), learner)

    return 1.0 / (2 * calls_per_second(two_updates, budget_s, warm_up_calls=2))


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    budget_s = 0.05 if quick else 1.5
    table = Table(
        "updates",
        "One update step, flax against torch (TD3, VPG: HalfCheetah; DQN: Doors)",
        [
            "algo",
            "batch_size",
            "torch_ms",
            "flax_ms",
            "torch_over_flax",
            "flax_updates_per_s",
            "torch_updates_per_s",
        ],
        notes=[
            "torch_over_flax > 1: flax's update is that many times faster.",
            "TD3: mean of critic-only and critic + delayed actor/target updates;"
            " VPG: one policy step plus value_iterations full-batch value steps;"
            " DQN: one step on a replay batch (one-hot Doors grid, 900 inputs).",
            f"torch threads: {torch.get_num_threads()}; jax devices: {jax.devices()}.",
        ],
    )
    for algo, (task, _, full_sizes, quick_sizes) in CASES.items():
        run_cfg = compose([f"algo={algo}", f"task={task}", "backend=torch", "env=gym-sync"])
        table.configs.append(f"algo={algo} task={task}: {dict(run_cfg.algo)}")
        for size in quick_sizes if quick else full_sizes:
            seconds = {b: time_update(algo, b, run_cfg, size, budget_s) for b in ("torch", "flax")}
            table.add(
                algo=algo,
                batch_size=size,
                torch_ms=1e3 * seconds["torch"],
                flax_ms=1e3 * seconds["flax"],
                torch_over_flax=seconds["torch"] / seconds["flax"],
                flax_updates_per_s=1.0 / seconds["flax"],
                torch_updates_per_s=1.0 / seconds["torch"],
            )
    return write_results(table, out_dir, _plot)


def _plot(table: Table, ax: Any) -> None:
    for color, algo in enumerate(CASES):
        rows = [r for r in table.rows if r["algo"] == algo]
        sizes = [r["batch_size"] for r in rows]
        ax.plot(
            sizes,
            [r["torch_ms"] for r in rows],
            "--",
            color=f"C{color}",
            marker="s",
            label=f"{algo} torch",
        )
        ax.plot(
            sizes,
            [r["flax_ms"] for r in rows],
            "-",
            color=f"C{color}",
            marker="o",
            label=f"{algo} flax",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per update step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
