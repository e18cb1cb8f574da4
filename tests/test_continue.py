"""Continuing a run: ``resume=<run> total_steps=<larger>`` extends a finished or stopped run,
and ``init_from=<run>`` starts a new run from a saved agent's weights.

Extending is exact where no schedule depends on ``total_steps``: the run of N steps
continued to 2N ends as the run of 2N steps uninterrupted does, weights and metrics bit for
bit. A schedule over ``total_steps`` (epsilon's decay, ``anneal_lr``) follows the new
``total_steps`` from the saved step on, as the longer run's does there (README, "Continuing
a run").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import rlspeed
from rlspeed import statefile
from rlspeed.checkpoint import RESUME_FILE
from tests.conftest import logged_rows, refused_line, saved_agent, slow_but, vouch

# Tiny DQN on GridWorld with a constant epsilon (start_e = end_e) and no annealed step size:
# no schedule depends on total_steps. Logs and evaluations land on the first run's end (a
# multiple of log_every, whole iterations of num_envs steps each).
DQN = {
    "algo": "dqn",
    "task": "gridworld",
    "tracking": "none",
    "progress": "none",
    **{"algo.hidden_sizes": [16], "algo.learning_starts": 200, "algo.buffer_size": 1000},
    **{"algo.batch_size": 32, "algo.target_network_frequency": 200},
    **{"algo.start_e": 0.3, "algo.end_e": 0.3},
}
STACKS = {
    "torch-gym-sync": {"backend": "torch", "env": "gym-sync", "num_envs": 4, "steps": 600},
    "flax-jax-vmap": {"backend": "flax", "env": "jax-vmap", "num_envs": 8, "steps": 4000},
    # A buffer the first run fills to 8%: its resume file holds that part, put back whole.
    "flax-jax-vmap-filling": {
        **{"backend": "flax", "env": "jax-vmap", "num_envs": 8, "steps": 4000},
        "algo.buffer_size": 50_000,
    },
}
LOGS = {"torch-gym-sync": 300, "flax-jax-vmap": 1000, "flax-jax-vmap-filling": 1000}
# What must match exactly (wall-time rates aside).
SAME = ("status", "score", "rolling_step_reward", "recent_return", "env_steps", "gradient_updates")


@pytest.mark.parametrize("stack", slow_but("torch-gym-sync", list(STACKS)))
def test_a_finished_run_extended_ends_like_the_longer_run_uninterrupted(tmp_path, stack):
    """N steps, then ``resume=`` with ``total_steps=2N``: the same agent, metrics and
    logged rows as 2N steps in one go (from Python; the command takes the same keys)."""
    stack_args = dict(STACKS[stack])
    steps = stack_args.pop("steps")
    args = {**DQN, **stack_args, "log_every": LOGS[stack], "eval_every": LOGS[stack]}
    whole = rlspeed.train(**args, total_steps=2 * steps, out_dir=tmp_path / "whole")
    first = rlspeed.train(**args, total_steps=steps, out_dir=tmp_path / "first")
    assert first.metrics["status"] == "FINISHED" and first.metrics["env_steps"] == steps
    extended = rlspeed.train(
        **args, total_steps=2 * steps, resume=str(first.output_dir), out_dir=tmp_path / "more"
    )
    assert {k: extended.metrics[k] for k in SAME} == {k: whole.metrics[k] for k in SAME}
    assert extended.metrics["env_steps"] == 2 * steps
    assert saved_agent(extended.output_dir) == saved_agent(whole.output_dir)
    assert logged_rows(extended.output_dir) == logged_rows(whole.output_dir)
    # The steps added trained the agent: the first run's is not the longer run's.
    assert saved_agent(first.output_dir) != saved_agent(whole.output_dir)
    if stack == "flax-jax-vmap-filling":  # 4,000 transitions and the next 8 observations
        saved = statefile.load(first.output_dir / RESUME_FILE)["state"]
        assert max(len(leaf) for leaf in saved if np.ndim(leaf)) == steps + 8


def test_a_schedule_over_total_steps_follows_the_new_total_from_the_saved_step(tmp_path):
    """Epsilon decaying over all of ``total_steps`` (Q-learning, 1 to 0): the extended run
    keeps the first run's rows (its schedule over N steps) and from step N on logs the
    epsilon of the run of 2N steps, not the first run's end value."""
    args = {"algo": "qlearn", "task": "gridworld", "backend": "torch", "env": "gym-sync"}
    args |= {"num_envs": 2, "log_every": 100, "eval_every": 200, "tracking": "none"}
    args |= {"progress": "none", "algo.start_e": 1.0, "algo.end_e": 0.0}
    args |= {"algo.exploration_fraction": 1.0}
    whole = rlspeed.train(**args, total_steps=400, out_dir=tmp_path / "whole")
    first = rlspeed.train(**args, total_steps=200, out_dir=tmp_path / "first")
    extended = rlspeed.train(
        **args, total_steps=400, resume=str(first.output_dir), out_dir=tmp_path / "more"
    )

    def epsilons(result: rlspeed.api.Result) -> dict[float, float]:
        return {row["step"]: row["charts/epsilon"] for row in result.metrics["history"]}

    kept, longer = epsilons(first), epsilons(whole)
    assert epsilons(extended) == {**kept, 300.0: longer[300.0], 400.0: longer[400.0]}
    # The first run had decayed to its end value; the longer run's schedule has not.
    assert kept[200.0] < 0.02 and longer[300.0] > 0.25


def test_an_extended_run_keeps_the_default_log_interval_it_ran_with(tmp_path):
    """log_every left to its default shrinks with total_steps (20 rows a run); a run
    extended to a larger total_steps keeps the interval it ran with, which its resume
    state is cut to, instead of being refused as a run of another config."""
    args = {"algo": "qlearn", "task": "gridworld", "backend": "torch", "env": "gym-sync"}
    args |= {"num_envs": 2, "tracking": "none", "progress": "none"}
    first = rlspeed.train(**args, total_steps=200, out_dir=tmp_path / "first")
    extended = rlspeed.train(
        **args, total_steps=400, resume=str(first.output_dir), out_dir=tmp_path / "more"
    )
    steps = [int(row["step"]) for row in extended.metrics["history"]]
    assert steps == list(range(10, 401, 10))  # 200 // 20, kept past step 200


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished torch Q-learning run's folder (fast)."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    args = {"algo": "qlearn", "task": "gridworld", "backend": "torch", "env": "gym-sync"}
    args |= {"num_envs": 2, "total_steps": 200, "log_every": 100, "tracking": "none"}
    rlspeed.train(**args, progress="none", out_dir=folder)
    return folder


TORCH = ["backend=torch", "env=gym-sync"]
QLEARN = ["algo=qlearn", "task=gridworld", "num_envs=2", "log_every=100", "tracking=none", *TORCH]


def _refused(args: list[str], tmp_path: Path, monkeypatch, capsys) -> str:
    """The command line's one line for ``args`` (exit 2, nothing created)."""
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    line = refused_line(args, capsys)
    assert sorted(tmp_path.rglob("*")) == before
    return line


def test_fewer_steps_than_the_run_trained_is_one_line(finished_run, tmp_path, monkeypatch, capsys):
    shutil.copytree(finished_run, tmp_path / "run")
    line = _refused([*QLEARN, "total_steps=100", "resume=run"], tmp_path, monkeypatch, capsys)
    assert line == (
        "rlspeed: invalid total_steps=100: expected >= 200, the env steps the run in "
        "resume=run has trained (a resumed run trains on from there; a larger total_steps "
        "extends it)"
    )


def test_a_run_without_its_resume_state_says_why_and_what_to_do(
    finished_run, tmp_path, monkeypatch, capsys
):
    """A sweep's trial drops its resume state when it ends (unless keep_resume): resume=
    says so in one line and names init_from=, which starts a new run from its agent."""
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    (folder / RESUME_FILE).unlink()
    args = [*QLEARN, "total_steps=400", "resume=run"]
    line = _refused(args, tmp_path, monkeypatch, capsys)
    assert line == (
        f"rlspeed: invalid resume=run: expected a run folder with {RESUME_FILE} (this one has "
        f"none: its env's state cannot be saved, or {RESUME_FILE} was removed); init_from=run "
        "starts a new run from its agent's weights"
    )
    # As a sweep's trial wrote it (the sweeper sets trial.*), vouched for.
    config = folder / "config.yaml"
    unset = "  storage: null\n  study_name: null\n  number: null\n"
    trial = "  storage: study.journal\n  study_name: s\n  number: 3\n"
    config.write_text(config.read_text().replace(unset, trial, 1))
    vouch(folder)
    line = _refused(args, tmp_path, monkeypatch, capsys)
    assert "(this one is trial 3 of a sweep, whose resume state is dropped when a trial " in line
    assert "ends unless hydra.sweeper.keep_resume=true); init_from=run starts a new run" in line


# ---------------------------------------------------------------- init_from=

# A step size far below a float32 weight's last digit: the weights the run starts from are
# the weights it saves, bit for bit, while its optimizer counts its own updates.
FROZEN = {"algo.learning_rate": 1e-30, "total_steps": 240, "seed": 5}


@pytest.mark.parametrize("stack", slow_but("torch-gym-sync", list(STACKS)))
def test_a_new_run_starts_from_a_saved_agents_weights_with_a_fresh_optimizer(tmp_path, stack):
    """``init_from=<run>``: a new folder, step 0, the saved agent's networks (target too),
    the optimizer's state of its own updates alone."""
    stack_args = dict(STACKS[stack])
    stack_args.pop("steps")
    source = rlspeed.train(**{**DQN, **stack_args}, total_steps=240, out_dir=tmp_path / "source")
    args = {**DQN, **stack_args, **FROZEN, "init_from": str(source.output_dir)}
    started = rlspeed.train(**args, out_dir=tmp_path / "new")
    metrics = started.metrics
    assert (metrics["status"], metrics["env_steps"]) == ("FINISHED", 240)
    new, old = saved_agent(started.output_dir), saved_agent(source.output_dir)
    if stack == "torch-gym-sync":
        for network in ("q_network", "target_network"):
            assert new[network] == old[network]
        adam = [state["step"] for state in new["optimizer"]["state"].values()]
        assert adam and all(step == metrics["gradient_updates"] for step in adam)
    else:
        import flax.serialization

        new, old = (flax.serialization.msgpack_restore(agent) for agent in (new, old))
        for params in ("params", "target_params"):
            assert jax_leaves(new[params]) == jax_leaves(old[params])
        assert int(new["opt_state"]["0"]["count"]) == metrics["gradient_updates"]
        assert int(old["opt_state"]["0"]["count"]) == source.metrics["gradient_updates"]


def jax_leaves(tree: dict) -> list:
    import jax

    return [leaf.tolist() for leaf in jax.tree.leaves(tree)]


def test_a_run_started_from_weights_resumes_without_reading_them_again(finished_run, tmp_path):
    """The same command plus ``resume=`` continues the new run's own agent: the folder it
    started from is not read again (here it is gone)."""
    source = tmp_path / "source"
    shutil.copytree(finished_run, source)
    args = {"algo": "qlearn", "task": "gridworld", "backend": "torch", "env": "gym-sync"}
    args |= {"num_envs": 2, "log_every": 100, "tracking": "none", "progress": "none"}
    args |= {"init_from": str(source)}
    started = rlspeed.train(**args, total_steps=200, out_dir=tmp_path / "new")
    assert started.metrics["env_steps"] == 200
    shutil.rmtree(source)
    extended = rlspeed.train(
        **args, total_steps=400, resume=str(started.output_dir), out_dir=tmp_path / "more"
    )
    assert extended.metrics["env_steps"] == 400


# Tiny Q-learning runs of two seeds: one agent file each on the host, one for both fused.
SEEDS = {"algo": "qlearn", "task": "gridworld", "num_envs": 2, "total_steps": 200}
SEEDS |= {"log_every": 100, "tracking": "none", "progress": "none", "num_seeds": 2}


def test_init_from_takes_one_agent_of_a_run_of_several(tmp_path, monkeypatch, capsys):
    """A run folder holding several agents is refused in one line naming its files; one of
    those files is taken."""
    rlspeed.train(**SEEDS, backend="torch", env="gym-sync", out_dir=tmp_path / "seeds")
    line = _refused([*QLEARN, "init_from=seeds"], tmp_path, monkeypatch, capsys)
    assert line == (
        "rlspeed: invalid init_from=seeds: expected one agent: one of its files "
        "(checkpoint_seed0.pt, checkpoint_seed1.pt)"
    )
    one = str(tmp_path / "seeds" / "checkpoint_seed1.pt")
    started = rlspeed.train(
        **{**SEEDS, "num_seeds": 1}, backend="torch", env="gym-sync", init_from=one,
        out_dir=tmp_path / "one",
    )  # fmt: skip
    assert started.metrics["status"] == "FINISHED"


@pytest.mark.slow  # a fused program compiled, a PPO run
def test_init_from_refuses_what_it_cannot_carry(tmp_path, monkeypatch, capsys):
    """A fused run's seeds are saved together: refused; so is an agent whose observation
    statistics (PPO's normalize_obs) a new run would not carry."""
    rlspeed.train(**SEEDS, backend="flax", env="jax-vmap", out_dir=tmp_path / "fused")
    fused = [*QLEARN[:-2], "backend=flax", "env=jax-vmap", "init_from=fused"]
    line = _refused(fused, tmp_path, monkeypatch, capsys)
    assert line == (
        "rlspeed: invalid init_from=fused: expected one agent (its checkpoint.msgpack holds the "
        "2 seeds of one fused run; train one seed, or start from a run of one)"
    )
    ppo = {"algo": "ppo", "task": "cartpole", "num_envs": 2, "total_steps": 32}
    ppo |= {"algo.num_steps": 16, "algo.normalize_obs": True, "tracking": "none"}
    rlspeed.train(**ppo, backend="torch", env="gym-sync", out_dir=tmp_path / "normalized")
    normalized = [f"{key}={value}" for key, value in ppo.items()]
    line = _refused([*normalized, *TORCH, "init_from=normalized"], tmp_path, monkeypatch, capsys)
    assert line == (
        "rlspeed: invalid init_from=normalized: expected an agent trained without "
        "algo.normalize_obs (its observation statistics are not carried into a new run)"
    )
