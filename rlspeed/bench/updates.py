"""``updates``: the time of one TD3 and one VPG update step, flax against torch, across
batch sizes, on HalfCheetah's spaces (17-dim observations, 6-dim actions) as in seed 003.

Each backend's own host-loop learner is timed on the same NumPy batch, as the
Gymnasium engines hand it over: torch wraps it without a copy, jax transfers it into its
jitted update. One TD3 update is the mean over an even number of calls, so half of them
include the delayed actor and target step; one VPG update is one policy step plus
``value_iterations`` value steps.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import jax
import numpy as np
import torch

from rlspeed.algos.replay import Batch
from rlspeed.algos.vpg.rollout import RolloutBatch
from rlspeed.bench.common import Table, write_results

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
FULL_BATCH_SIZES = {"td3": (64, 256, 1024, 4096), "vpg": (256, 1024, 4096, 16384)}
QUICK_BATCH_SIZES = {"td3": (64, 256), "vpg": (256, 1024)}


def _batch(algo: str, size: int, rng: np.random.Generator) -> Any:
    obs = rng.standard_normal((size, *OBS_SPACE.shape), dtype=np.float32)
    actions = rng.uniform(-1, 1, (size, *ACTION_SPACE.shape)).astype(np.float32)
    rewards = rng.standard_normal(size, dtype=np.float32)
    if algo == "td3":
        next_obs = rng.standard_normal(obs.shape, dtype=np.float32)
        return Batch(obs, next_obs, actions, rewards, np.zeros(size, np.float32))
    return RolloutBatch(obs, actions, rewards, rewards + 1.0)


def _sync(result: Any, learner: Any) -> None:
    """Wait for the work queued by a JAX learner (torch on CPU is already done)."""
    agent = getattr(learner, "agent", None)
    if agent is not None:
        jax.block_until_ready((agent, result))


def time_update(algo: str, backend: str, algo_cfg: Any, size: int, budget_s: float) -> float:
    """Seconds per update step after warm-up (which includes compilation)."""
    module = importlib.import_module(f"rlspeed.algos.{algo}.{backend}")
    learner_cls = module.TorchLearner if backend == "torch" else module.FlaxLearner
    learner = learner_cls(OBS_SPACE, ACTION_SPACE, algo_cfg, 0)
    batch = _batch(algo, size, np.random.default_rng(0))
    for _ in range(4):
        _sync(learner.update(batch), learner)
    calls, start = 0, time.perf_counter()
    while True:
        for _ in range(2):
            result = learner.update(batch)
        _sync(result, learner)
        calls += 2
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and calls >= 4:
            return elapsed / calls


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    sizes = QUICK_BATCH_SIZES if quick else FULL_BATCH_SIZES
    budget_s = 0.05 if quick else 1.5
    table = Table(
        "updates",
        "One update step on HalfCheetah's spaces: flax against torch",
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
            " VPG: one policy step plus value_iterations full-batch value steps.",
            f"torch threads: {torch.get_num_threads()}; jax devices: {jax.devices()}.",
        ],
    )
    for algo in ("td3", "vpg"):
        algo_cfg = compose([f"algo={algo}", "task=halfcheetah"]).algo
        table.configs.append(f"algo={algo} task=halfcheetah: {dict(algo_cfg)}")
        for size in sizes[algo]:
            seconds = {b: time_update(algo, b, algo_cfg, size, budget_s) for b in ("torch", "flax")}
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
    for color, algo in enumerate(("td3", "vpg")):
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
