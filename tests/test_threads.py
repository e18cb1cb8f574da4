"""backend.threads=auto: resolved to a number from the run's sizes before the backend starts,
and that number is what the run records; an explicit number is kept."""

from __future__ import annotations

import os

import pytest

from rlspeed.config_tree import flatten
from rlspeed.core.algos.encoding import input_size
from rlspeed.registry import TASKS
from rlspeed.validation import check

# PureJaxRL's DQN on CartPole: [120, 84] at batch 128 with 10 envs.
# What auto gives a larger network: flax every core (XLA's default, 0); torch every core but
# one, so that one busy program beside the run holds no thread of it up.
LARGER = {"flax": 0, "torch": max(1, (os.cpu_count() or 1) - 1)}
CARTPOLE_DQN = ["task=cartpole", "num_envs=10", "algo.hidden_sizes=[120,84]"]


@pytest.mark.parametrize("backend", ["flax", "torch"])
@pytest.mark.parametrize(
    ("overrides", "threads"),
    [
        (CARTPOLE_DQN, 1),  # a small network: one thread
        (["task=cartpole"], 1),  # DQN's CartPole defaults: [128, 128] at batch 128
        # 900 one-hot inputs into [64, 64] at 128 rows: two threads ran 40% faster.
        (["algo=ppo", "task=doors"], LARGER),
        ([], LARGER),  # DQN on Doors: 900 one-hot inputs at batch 128
        (["task=cartpole", "algo.hidden_sizes=[256,256]"], LARGER),
        (["algo=qlearn", "task=gridworld"], 0),  # tabular: no network, the default
    ],
)
def test_auto_picks_one_thread_for_small_networks(make_cfg, backend, overrides, threads):
    cfg = make_cfg([f"backend={backend}", "env=gym-sync", *overrides, "tracking=none"])
    assert cfg.backend.threads == "auto"
    cfg = check(cfg).cfg
    threads = threads[backend] if isinstance(threads, dict) else threads
    assert cfg.backend.threads == threads
    assert flatten(cfg)["backend.threads"] == threads  # the MLflow param


def test_vmapped_seeds_count_as_one_larger_product(make_cfg):
    """On the fused path the seeds share each matrix product, so enough of them make it large."""
    one, many = (make_cfg(["task=cartpole", f"num_seeds={n}", "tracking=none"]) for n in (1, 8))
    one, many = check(one).cfg, check(many).cfg
    assert (one.backend.threads, many.backend.threads) == (1, 0)


@pytest.mark.parametrize("threads", [0, 1, 2])
def test_an_explicit_number_is_kept(make_cfg, threads):
    cfg = make_cfg([*CARTPOLE_DQN, f"backend.threads={threads}", "tracking=none"])
    assert check(cfg).cfg.backend.threads == threads


@pytest.mark.parametrize(
    "overrides",
    [["task=doors"], ["task=doors", "task.grid_size=7"], ["task=gridworld"], ["task=cartpole"],
     ["task=pendulum"], ["task=halfcheetah"]],
)  # fmt: skip
def test_network_inputs_are_the_width_the_network_is_built_with(make_cfg, overrides):
    """auto counts the first layer from the settings alone; the envs' spaces must agree."""
    cfg = make_cfg(overrides)
    task = TASKS.get(cfg.task.name)
    env = task.make_env(cfg.task)
    try:
        assert task.network_inputs(cfg.task) == input_size(env.observation_space)
    finally:
        env.close()
