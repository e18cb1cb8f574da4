"""SPEC §4, what runs with what: every valid (algo, task, backend, engine) cell trains and
shows a learning signal; every invalid one stops at start-up with one clear line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlspeed.errors import ConfigError
from rlspeed.run import run
from rlspeed.validation import check
from tests.conftest import logged_rows, run_cli, saved_agent, slow_but

# (algo, task, engine) -> (the key the error names, words of what would work).
INVALID = [
    ("td3", "doors", "jax-vmap", "algo", ["algo=td3", "discrete", "dqn"]),
    ("td3", "gridworld", "gym-sync", "algo", ["algo=td3", "discrete"]),
    ("td3", "cartpole", "jax-vmap", "algo", ["algo=td3", "discrete"]),
    ("sac", "doors", "gym-sync", "algo", ["algo=sac", "discrete", "dqn"]),
    ("dqn", "pendulum", "gym-sync", "algo", ["algo=dqn", "continuous", "td3"]),
    ("dqn", "halfcheetah", "gym-async", "algo", ["algo=dqn", "continuous", "td3"]),
    ("qlearn", "pendulum", "jax-vmap", "algo", ["algo=qlearn", "continuous"]),
    ("qlearn", "cartpole", "gym-sync", "task", ["task=cartpole", "tabular", "gridworld"]),
    ("vpg", "gridworld", "gym-sync", "task", ["task=gridworld", "algo=vpg", "cartpole"]),
    ("ppo", "gridworld", "gym-async", "task", ["task=gridworld", "algo=ppo", "cartpole"]),
]


@pytest.mark.parametrize(("algo", "task", "engine", "key", "fragments"), INVALID)
@pytest.mark.parametrize("backend", ["torch", "flax"])
def test_invalid_cell_is_rejected_before_any_work(
    make_cfg, algo, task, engine, key, fragments, backend
):
    cfg = make_cfg([f"algo={algo}", f"task={task}", f"env={engine}", f"backend={backend}"])
    with pytest.raises(ConfigError) as error:
        check(cfg)
    assert error.value.key == key
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


ENGINES = ("gym-sync", "gym-async", "jax-vmap")
STACKS = [(backend, engine) for backend in ("torch", "flax") for engine in ENGINES]
QUIET = ["tracking=none", "progress=none"]

# (algo, task) -> a small seeded run of it. DQN's learn on every stack below (no other file
# trains DQN on each); the others' are the gym-async cells' runs, their learning covered by
# their own files: qlearn x gridworld and doors (test_qlearn.py), vpg x cartpole
# (test_vpg.py, every stack), ppo x cartpole (test_ppo.py, three stacks; the probes learn
# PPO's closed forms on the other two), td3 x pendulum (test_td3.py), dqn x doors
# (test_learning.py, fused). vpg x pendulum learns on the fused stack (test_vpg.py); on the
# host stacks a small budget lands anywhere from -250 to -1360 by seed and stack, so those
# run as smoke cells below.
RUNS = {
    ("dqn", "gridworld"): [
        "total_steps=6000", "num_envs=8", "algo.learning_starts=500", "algo.learning_rate=0.001"
    ],
    ("dqn", "cartpole"): [
        "total_steps=12000", "num_envs=8", "algo.learning_starts=1000", "eval_every=12000",
        "algo.train_frequency=2",
    ],
    ("qlearn", "doors"): ["task.grid_size=7", "num_envs=8"],
    ("vpg", "doors"): [
        "task.grid_size=7", "num_envs=8", "algo.policy_lr=0.003", "algo.hidden_sizes=[32]"
    ],
    # conf/algo_task/ppo_doors.yaml's settings (gamma 0.9) on 7x7.
    ("ppo", "doors"): ["task.grid_size=7", "num_envs=8", "algo.hidden_sizes=[32]"],
}  # fmt: skip
# The score a clearly learning DQN run beats: on GridWorld greedy from an untrained network
# loops (score 0) and 1.0 is the goal within 50 steps; random CartPole returns about 22, an
# untrained greedy network about 9.
LEARNS = {("dqn", "gridworld"): 0.99, ("dqn", "cartpole"): 100.0}
# gym-async runs the gym-sync envs in subprocesses, so a run on it is the gym-sync run to
# the bit: its cells check exactly that (below) instead of learning again at 2-4x the time.
LEARNING_CELLS = [(*pair, *stack) for pair in LEARNS for stack in STACKS if stack[1] != "gym-async"]


def _train(make_cfg, folder, monkeypatch, algo, task, backend, engine, *overrides) -> float:
    folder.mkdir()
    monkeypatch.chdir(folder)
    return run(
        make_cfg(
            [f"algo={algo}", f"task={task}", f"backend={backend}", f"env={engine}", *overrides]
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "task", "backend", "engine"), LEARNING_CELLS)
def test_valid_cell_learns(make_cfg, tmp_path, monkeypatch, algo, task, backend, engine):
    cell = (algo, task, backend, engine)
    score = _train(make_cfg, tmp_path / "run", monkeypatch, *cell, *RUNS[(algo, task)], *QUIET)
    assert score >= LEARNS[(algo, task)], f"{algo} {task} {backend}+{engine}: score {score}"


ASYNC_CELLS = [(*pair, backend) for pair in sorted(RUNS) for backend in ("torch", "flax")]


@pytest.mark.parametrize(
    ("algo", "task", "backend"), slow_but(("qlearn", "doors", "torch"), ASYNC_CELLS)
)
def test_gym_async_cell_trains_exactly_as_gym_sync(
    make_cfg, tmp_path, monkeypatch, algo, task, backend
):
    """The first 2,048 steps of the learning cell's run: every logged row, the score and
    the saved agent (networks and optimiser) equal on gym-async and gym-sync."""
    overrides = [*RUNS[(algo, task)], "total_steps=2048", "log_every=256", *QUIET]
    scores = {
        engine: _train(
            make_cfg, tmp_path / engine, monkeypatch, algo, task, backend, engine, *overrides
        )
        for engine in ("gym-sync", "gym-async")
    }
    sync, async_ = tmp_path / "gym-sync", tmp_path / "gym-async"
    rows = logged_rows(sync)
    assert len(rows) == 8 and rows[-1]["charts/gradient_updates"] > 0
    assert logged_rows(async_) == rows
    assert scores["gym-async"] == scores["gym-sync"]
    assert saved_agent(async_) == saved_agent(sync)


# HalfCheetah learns only over tens of thousands of MuJoCo steps (minutes: SPEC §6 makes the
# full run a benchmark), so its cells are smoke runs: every stack (jax-vmap: on MJX) trains,
# evaluates and records finite numbers. One multirun process per (algo, task). The envs are
# the same for every Box-action algorithm, so HalfCheetah's cells run one loop (TD3's, 85 s
# on 2 cores); the on-policy loops run every stack on Pendulum's cells below, SAC on the
# probes' engines (tests/test_probes.py), PPO on MJX in the playground selection.
SMOKE = {
    ("td3", "halfcheetah"): ["algo.learning_starts=100", "algo.batch_size=16"],
    ("vpg", "pendulum"): ["algo.num_steps=25"],
    # Batches of 2 envs x 25 steps, in 2 minibatches.
    ("ppo", "pendulum"): ["algo.num_steps=25", "algo.num_minibatches=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "task"), sorted(SMOKE))
def test_smoke_cells_train_on_every_stack(tmp_path, algo, task):
    args = [
        "-m", f"algo={algo}", f"task={task}", "backend=torch,flax", f"env={','.join(ENGINES)}",
        "num_envs=2", "total_steps=200", "log_every=100", "eval_every=200", "task.max_steps=50",
        "task.eval_episodes=1", "algo.hidden_sizes=[16]", *SMOKE[(algo, task)],
        "tracking=none", "progress=plain",
    ]  # fmt: skip
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = sorted((tmp_path / "outputs" / "multirun").glob(f"*/*/*_{algo}_{task}"))
    stacks = sorted(tuple(job.name.split("_")[1:3]) for job in jobs)
    assert stacks == sorted((b, e) for b in ("torch", "flax") for e in ENGINES)
    for job in jobs:
        metrics = json.loads((job / "metrics.json").read_text())
        assert metrics["env_steps"] == 200 and metrics["gradient_updates"] > 0, job.name
        assert np.isfinite(metrics["score"]) and np.isfinite(metrics["recent_return"]), job.name
