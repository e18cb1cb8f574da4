"""``cartpole``: DQN on CartPole per stack, env steps/s and the return reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlspeed.bench.stacks import compare_stacks


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    overrides = ["algo=dqn", "task=cartpole", "seed=1"]
    if quick:
        overrides += ["total_steps=2048", "algo.learning_starts=1024", "eval_every=2048"]
    return compare_stacks(
        "cartpole",
        "DQN on CartPole-v1 per stack (conf/algo_task/dqn_cartpole.yaml)",
        overrides,
        out_dir,
        [
            "Seed 004: 15,807 env steps/s (one CPU). SPEC goal: >= 100,000 env steps/s while the"
            " last-20-episode return reaches >= 475."
        ],
    )
