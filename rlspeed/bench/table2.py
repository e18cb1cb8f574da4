"""``table2``: DQN on Doors on four stacks at equal env steps (the seed's Table 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlspeed.bench.stacks import compare_stacks


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    # A multiple of every engine's default num_envs (8, 128), so each stack takes exactly
    # these env steps.
    overrides = ["algo=dqn", "task=doors", "seed=1", "total_steps=307200"]
    if quick:
        overrides += ["total_steps=3072", "algo.learning_starts=1024", "eval_every=3072"]
    return compare_stacks(
        "table2",
        "DQN on Doors (15x15, 3 doors): four stacks at equal env steps",
        overrides,
        out_dir,
        [
            "Seed's Table 2 (GPU): rolling reward 0.73 / 0.64 / 0.71, 22.5 / 22.8 / 2.3 min.",
            "num_envs is each engine's default (gym 8, jax-vmap 128); DQN's update schedule"
            " counts env steps, so the gradient updates are the same.",
        ],
        budget_s=0.2 if quick else 5.0,
        baseline_env_id="rlspeed/Doors-v0",
    )
