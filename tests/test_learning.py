"""DQN learns Doors in one fused program, and runs are reproducible.

The learning run uses a 7x7 Doors grid and a budget of seconds; the full 15x15 targets are
measured by the training runs and benchmarks, not here. DQN learns on every other stack in
tests/test_matrix.py (GridWorld and CartPole cells); the other algorithms learn in their own
test files.
"""

from __future__ import annotations

import json

import numpy as np

from rlspeed.registry import TASKS
from tests.conftest import logged_rows, run_in, saved_agent

SMALL_DOORS = [
    "task.grid_size=7",
    "num_envs=8",
    "total_steps=24000",
    "log_every=2000",
    "eval_every=6000",
    "algo.learning_starts=1000",
    "algo.buffer_size=24000",
    "algo.learning_rate=0.001",
    "algo.target_network_frequency=500",
    "tracking=none",
    "progress=none",
]


def _random_policy_score(make_cfg) -> float:
    cfg = make_cfg(SMALL_DOORS)
    rng = np.random.default_rng(0)
    return TASKS.get("doors").evaluate(cfg.task, lambda obs: rng.integers(0, 5, len(obs)), 0)


def _best_score(make_cfg) -> float:
    """The score of walking a shortest path from every start column (7x7: doors 1, 3, 5)."""
    cfg = make_cfg(SMALL_DOORS)
    size, doors = cfg.task.grid_size, (1, 3, 5)
    total_distance = total_steps = 0.0
    for col in range(size):
        goal = size - 1 - col
        total_distance += np.hypot(size - 1, goal - col)
        total_steps += size - 1 + min(abs(col - d) + abs(d - goal) for d in doors)
    return total_distance / total_steps


def test_the_fused_program_learns_doors(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg(["backend=flax", "env=jax-vmap", *SMALL_DOORS])
    score = run_in(tmp_path / "run", monkeypatch, cfg)["score"]
    random_score, best = _random_policy_score(make_cfg), _best_score(make_cfg)
    assert random_score < 0.2 * best
    # Clearly learned: most of the way from a random policy to the optimum.
    assert score >= 0.85 * best, f"score {score:.3f}, optimum {best:.3f}"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["env_steps"] == 24000 and metrics["gradient_updates"] == (24000 - 1000) // 4


def _two_runs(make_cfg, tmp_path, monkeypatch, overrides):
    outputs = []
    for name in ("first", "second"):
        run_in(
            tmp_path / name,
            monkeypatch,
            make_cfg(
                [*SMALL_DOORS, "total_steps=3000", "log_every=1000", "eval_every=3000", *overrides]
            ),
        )
        outputs.append(logged_rows(tmp_path / name))
    return outputs


def test_fused_flax_run_is_bitwise_reproducible(make_cfg, tmp_path, monkeypatch):
    first, second = _two_runs(make_cfg, tmp_path, monkeypatch, ["backend=flax", "env=jax-vmap"])
    assert first == second
    assert saved_agent(tmp_path / "first") == saved_agent(tmp_path / "second")


def test_torch_gym_sync_run_is_bitwise_reproducible(make_cfg, tmp_path, monkeypatch):
    first, second = _two_runs(make_cfg, tmp_path, monkeypatch, ["backend=torch", "env=gym-sync"])
    assert first == second
    assert saved_agent(tmp_path / "first") == saved_agent(tmp_path / "second")
