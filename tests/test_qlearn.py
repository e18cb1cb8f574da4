"""Tabular Q-learning: random tie-breaking, the batched update rule, learning on every stack,
many seeds as one fused program, and the one-line error on a task without a tabular state."""

from __future__ import annotations

import json
from pathlib import Path

import flax.serialization
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from gymnasium.spaces import Discrete

from rlspeed.core.algos.qlearn import QLearnConfig
from rlspeed.core.algos.qlearn.flax import FlaxQTable
from rlspeed.core.algos.qlearn.torch import TorchQTable
from rlspeed.core.tasks.gridworld import greedy_path, shortest_path_length
from rlspeed.registry import TASKS
from tests.conftest import learner_cfg, run_in, slow_but

LEARNERS = {"torch": TorchQTable, "flax": FlaxQTable}
COMBINATIONS = [(b, e) for b in ("torch", "flax") for e in ("gym-sync", "gym-async", "jax-vmap")]
# Multiples of num_envs and of each other, so the fused loop compiles one chunk size.
BUDGET = ["num_envs=8", "log_every=1000", "progress=none"]
QUIET = [*BUDGET, "tracking=none"]


def _q_table(out_dir: Path) -> np.ndarray:
    if (out_dir / "checkpoint.pt").exists():
        return torch.load(out_dir / "checkpoint.pt")["q_table"].numpy()
    state = flax.serialization.msgpack_restore((out_dir / "checkpoint.msgpack").read_bytes())
    return np.asarray(state["q_table"])


def _actions(learner, states: np.ndarray, epsilon: float) -> np.ndarray:
    return np.asarray(learner.act(states.astype(np.int32), 0, epsilon))


@pytest.mark.parametrize("backend", LEARNERS)
def test_ties_are_broken_uniformly_at_random(backend):
    learner = LEARNERS[backend](
        Discrete(25), Discrete(4), learner_cfg(QLearnConfig(), total_steps=1000), seed=0
    )
    samples = 20_000
    # A fresh all-zero table: every action is maximal, so greedy picks uniformly.
    counts = np.bincount(_actions(learner, np.zeros(samples), 0.0), minlength=4)
    expected = samples / 4
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 16.27, counts  # 3 degrees of freedom, p = 0.001
    # Two tied maxima: only they are picked, about equally often; epsilon=1 picks any.
    q = [[1.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]
    learner.q = torch.tensor(q) if backend == "torch" else jnp.asarray(q)
    counts = np.bincount(_actions(learner, np.zeros(samples), 0.0), minlength=4)
    assert counts[1] == counts[3] == 0 and abs(counts[0] - counts[2]) < 0.05 * samples
    counts = np.bincount(_actions(learner, np.zeros(samples), 1.0), minlength=4)
    assert counts.min() > 0.23 * samples


def test_batched_update_averages_duplicates_alike_on_both_backends():
    algo = QLearnConfig(alpha=0.5, gamma=0.5)
    q0 = np.array([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    # (s, a, r, s', terminated); every target uses the table before the update.
    states = np.array([0, 0, 1, 2], dtype=np.int32)
    actions = np.array([1, 1, 0, 1], dtype=np.int32)
    rewards = np.array([1.0, 3.0, 0.0, 1.0], dtype=np.float32)
    next_states = np.array([1, 2, 0, 2], dtype=np.int32)
    terminated = np.array([False, True, False, False])
    # TD errors: 1 + .5*2 - 1 = 1;  3 - 1 = 2 (terminal);  0 + .5*1 - 2 = -1.5;  1 + 0 - 0 = 1.
    expected = q0.copy()
    expected[0, 1] += 0.5 * (1.0 + 2.0) / 2  # two transitions at (0, 1): their mean
    expected[1, 0] += 0.5 * -1.5
    expected[2, 1] += 0.5 * 1.0
    tables = {}
    for backend, make in LEARNERS.items():
        learner = make(Discrete(25), Discrete(2), learner_cfg(algo, total_steps=1000), seed=0)
        learner.q = torch.from_numpy(q0.copy()) if backend == "torch" else jnp.asarray(q0)
        acts = torch.from_numpy(actions) if backend == "torch" else jnp.asarray(actions)
        metrics = learner.update(states, acts, rewards, next_states, terminated)
        tables[backend] = np.asarray(learner.q)
        assert float(metrics["losses/td_error"]) == (1 + 2 + 1.5 + 1) / 4
        assert float(metrics["losses/q_values"]) == (1 + 1 + 2 + 0) / 4
    np.testing.assert_array_equal(tables["torch"], expected)
    np.testing.assert_array_equal(tables["flax"], expected)


@pytest.mark.parametrize(("backend", "engine"), slow_but(("torch", "gym-sync"), COMBINATIONS))
def test_every_stack_learns_a_shortest_path(backend, engine, make_cfg, tmp_path, monkeypatch):
    overrides = [f"backend={backend}", f"env={engine}", "algo=qlearn", "task=gridworld"]
    cfg = make_cfg([*overrides, *QUIET, "total_steps=4000", "eval_every=4000"])
    assert run_in(tmp_path / "run", monkeypatch, cfg)["score"] == 1.0
    q = _q_table(tmp_path / "run")
    path = greedy_path(cfg.task, lambda obs: q[obs].argmax(axis=1))
    assert len(path) - 1 == shortest_path_length(cfg.task), path
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    # One update per env step batch.
    assert metrics["env_steps"] == 4000 and metrics["gradient_updates"] == 4000 // 8


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "engine"), [("torch", "gym-sync"), ("flax", "jax-vmap")])
def test_learns_doors(backend, engine, make_cfg, tmp_path, monkeypatch):
    overrides = [f"backend={backend}", f"env={engine}", "algo=qlearn", "task=doors"]
    cfg = make_cfg([*overrides, "task.grid_size=7", *QUIET, "total_steps=20000"])
    score = run_in(tmp_path / "run", monkeypatch, cfg)["score"]
    rng = np.random.default_rng(0)
    random_score = TASKS.get("doors").evaluate(cfg.task, lambda o: rng.integers(0, 5, len(o)), 0)
    # 7x7 Doors' optimum is 0.758 (doors at columns 1, 3, 5); a random walk scores ~0.
    assert random_score < 0.15 and score > 0.7, (score, random_score)


def test_fused_seeds_are_one_program_with_per_seed_results(make_cfg, tmp_path, monkeypatch):
    overrides = ["backend=flax", "env=jax-vmap", "algo=qlearn", "task=gridworld", "num_seeds=4"]
    cfg = make_cfg([*overrides, *QUIET, "total_steps=4000", "eval_every=4000"])
    assert run_in(tmp_path / "run", monkeypatch, cfg)["score"] == 1.0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    seeds = metrics["seeds"]
    assert metrics["num_seeds"] == 4 and [s["env_steps"] for s in seeds] == [4000] * 4
    assert len({s["rolling_step_reward"] for s in seeds}) == 4  # four different agents
    assert metrics["env_steps"] == 16_000 and metrics["gradient_updates"] == 4 * 500
    # The logged rows are means over the per-seed streams (seed<i>/... in the tracker),
    # with their spread beside them.
    final = metrics["final"]
    assert final["losses/td_error_std"] > 0 and final["eval/score"] == 1.0
    # One vmapped train state: the four tables stacked in one checkpoint.
    q = _q_table(tmp_path / "run")
    assert q.shape == (4, 25, 4)
    for table in q:
        path = greedy_path(cfg.task, lambda obs, t=table: t[obs].argmax(axis=1))
        assert len(path) - 1 == shortest_path_length(cfg.task)
