"""``cartpole``: DQN on CartPole per stack, env steps/s and the return reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlspeed.bench.stacks import compare_stacks

# Throughput settings: one update per 8 env steps at batch 64 on a [64, 64] network (the
# default conf/algo_task/dqn_cartpole.yaml updates every env step at batch 128 on
# [128, 128]: 250k updates, ~2,800 env steps/s fused). XLA:CPU's update time grows with
# the batch (64: ~70 us, 128: ~107 us, 256: ~190 us), and updates are nearly all of a
# fused iteration's time. Seeds 1-8 trained as one vmapped run (num_seeds=8) all reached a
# greedy score of 500 and a last-20 return of 498-500.
THROUGHPUT = [
    # rlspeed on one thread: XLA runs these small updates 2x faster that way (see
    # conf/backend/flax.yaml); torch takes the same time with 1 or 2 (12.5 s either way).
    "backend.threads=1",
    "num_envs=32",
    "total_steps=512000",
    "log_every=51200",
    "eval_every=512000",
    "algo.hidden_sizes=[64,64]",
    "algo.batch_size=64",
    "algo.train_frequency=8",
    "algo.learning_rate=0.001",
    "algo.learning_starts=10240",
    "algo.buffer_size=200000",
    "algo.target_network_frequency=2000",
]


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    overrides = ["algo=dqn", "task=cartpole", "seed=1", *THROUGHPUT]
    if quick:
        overrides += [
            "total_steps=2048",
            "log_every=1024",
            "algo.learning_starts=1024",
            "eval_every=2048",
        ]
    return compare_stacks(
        "cartpole",
        "DQN on CartPole-v1 per stack (throughput settings: 1 update per 8 env steps)",
        overrides,
        out_dir,
        [
            "Seed 004: 15,807 env steps/s (one CPU). SPEC goal: >= 100,000 env steps/s while the"
            " last-20-episode return reaches >= 475."
        ],
        budget_s=0.2 if quick else 5.0,
        baseline_env_id="CartPole-v1",
    )
