"""The replay buffers keep every truncated transition's own final observation, however
often the envs truncate: an env of ``task=gym`` may truncate its episodes itself, at any
step, long before its time limit (issue 38: one truncated every 2 steps bootstrapped 989 of
1,000 truncated transitions from another episode's final observation).

Every observation here is (episode number, step in the episode), unique, so a transition's
true next observation is its own one step on: anything else is a wrong one."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

import rlspeed
from rlspeed import statefile
from rlspeed.checkpoint import RESUME_FILE, save_resume
from rlspeed.core.algos.replay import check_replay, draw_slots, replay_buffer, truncation_gap
from rlspeed.core.algos.replay_jax import JaxReplay, jax_replay_add, jax_replay_init
from rlspeed.core.state import capture, restore
from rlspeed.errors import ConfigError
from tests.conftest import slow_but

OBS = gym.spaces.Box(0.0, np.inf, (2,), np.float32)
ACTIONS = gym.spaces.Discrete(2)
ONE_STEP_ON = np.array([0.0, 1.0], np.float32)

# Episode lengths by truncation pattern, drawn per episode: every step, every 2 steps, and
# irregularly (1 to 5 steps).
PATTERNS: dict[str, Callable[[np.random.Generator], int]] = {
    "every-step": lambda rng: 1,
    "every-2-steps": lambda rng: 2,
    "irregular": lambda rng: int(rng.integers(1, 6)),
}


def _self_truncated_steps(
    num_envs: int, length: Callable[[np.random.Generator], int], steps: int
) -> Iterator[tuple[np.ndarray, ...]]:
    """Steps of envs that truncate their own episodes after ``length`` steps (terminating
    a few at random first): (obs, observation the step ended in, actions, rewards,
    terminated, truncated)."""
    rng = np.random.default_rng(0)
    episodes = iter(range(10**9))
    obs = np.array([[next(episodes), 0] for _ in range(num_envs)], np.float32)
    lengths = np.array([length(rng) for _ in range(num_envs)])
    for _ in range(steps):
        ended_in = obs + ONE_STEP_ON
        terminated = rng.random(num_envs) < 0.05
        truncated = ended_in[:, 1] >= lengths
        actions, rewards = rng.integers(0, 2, num_envs), np.zeros(num_envs, np.float32)
        yield obs, ended_in, actions, rewards, terminated, truncated
        obs = ended_in
        for e in np.flatnonzero(terminated | truncated):
            obs[e] = (next(episodes), 0)
            lengths[e] = length(rng)


def _wrong_next_observations(buffer: Any, num_envs: int, xp: Any) -> tuple[int, int]:
    """Over every transition a batch can draw from ``buffer`` (host or JAX): (those whose
    next observation is wrong, those truncated). Terminated ones need none."""
    slots, next_obs = draw_slots(
        buffer.obs,
        buffer.final_obs,
        buffer.final_index,
        buffer.position,
        buffer.size,
        xp.arange(buffer.size),
        num_envs,
        xp,
    )
    obs, next_obs = np.asarray(buffer.obs[slots]), np.asarray(next_obs)
    live = np.asarray(buffer.dones[slots]) == 0
    truncated = int(np.sum(np.asarray(buffer.final_index[slots]) >= 0))
    wrong = live & np.any(next_obs != obs + ONE_STEP_ON, axis=1)
    return int(wrong.sum()), truncated


def _gym_cfg(capacity: int, num_envs: int) -> Any:
    """What a replay buffer reads of a ``task=gym`` run's config (a 100-step time limit)."""
    task = {"name": "gym", "max_steps": 100}
    return OmegaConf.create({"algo": {"buffer_size": capacity}, "num_envs": num_envs, "task": task})


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize(("num_envs", "capacity"), slow_but((1, 9), [(3, 24), (4, 25), (1, 9)]))
def test_host_and_jax_buffers_keep_every_final_observation(pattern, num_envs, capacity):
    """Step by step, no transition either buffer can draw has a wrong next observation,
    sized as a ``task=gym`` run sizes them."""
    cfg = _gym_cfg(capacity, num_envs)
    host = replay_buffer(OBS, ACTIONS, cfg, seed=0)
    device = jax_replay_init(capacity, OBS, ACTIONS, num_envs, truncation_gap(cfg))
    add: Callable[..., JaxReplay] = jax.jit(jax_replay_add)
    truncated_seen = 0
    for step in _self_truncated_steps(num_envs, PATTERNS[pattern], steps=4 * capacity):
        host.add(*step)
        device = add(device, *(jnp.asarray(x) for x in step))
        wrong, truncated = _wrong_next_observations(host, num_envs, np)
        assert (wrong, truncated) == _wrong_next_observations(device, num_envs, jnp)
        assert wrong == 0, f"{wrong} of {truncated} truncated transitions"
        truncated_seen += truncated
    assert truncated_seen > 0


def test_a_resumed_gym_task_buffer_continues_bit_for_bit(tmp_path):
    """The larger final-observation ring goes through a resume file like any array: a
    buffer put back from one draws the same batches, step after step, as the one saved."""
    cfg = _gym_cfg(capacity=24, num_envs=3)
    saved, resumed = (replay_buffer(OBS, ACTIONS, cfg, seed=0) for _ in range(2))
    steps = _self_truncated_steps(3, PATTERNS["irregular"], steps=40)
    for step in itertools.islice(steps, 20):
        saved.add(*step)
    save_resume({"buffer": capture(saved)}, tmp_path / RESUME_FILE)
    restore(resumed, statefile.load(tmp_path / RESUME_FILE)["buffer"])
    for step in steps:
        for buffer in (saved, resumed):
            buffer.add(*step)
        for a, b in zip(saved.sample(16), resumed.sample(16), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_gym_task_holds_a_final_observation_per_transition_and_the_estimate_counts_them(
    make_cfg, monkeypatch
):
    """A built-in task's ring holds a few final observations (its time limit is its only
    truncation), a ``task=gym`` one's one per transition; the memory check counts them."""
    sizes = ["algo=dqn", "env=gym-sync", "num_envs=2", "algo.buffer_size=1000"]
    builtin = make_cfg(["task=cartpole", *sizes])  # 500-step episodes: 2 x (1 + 1) finals
    gym_cfg = make_cfg(["task=gym", "task.id=CartPole-v1", *sizes])
    monkeypatch.setattr("rlspeed.core.algos.physical_memory", lambda: 0)
    for cfg, finals in ((builtin, 4), (gym_cfg, 1_002)):
        assert replay_buffer(OBS, ACTIONS, cfg, seed=0).final_obs.shape == (finals, 2)
        with pytest.raises(ConfigError, match=f"and {finals:,} final observations of 16 bytes"):
            check_replay(cfg.algo, cfg)


@pytest.mark.parametrize(
    ("lengths", "truncations"),
    # The buffer holds the whole run, 500 steps of each of 2 envs: 2 x 500 truncations of
    # 1-step episodes, 2 x 250 of 2-step ones, 2 x (45 x 4 + 2) cycling 1, 3, 2, 5 steps.
    [([1], 1000), ([2], 500), ([1, 3, 2, 5], 364)],
    ids=["every-step", "every-2-steps", "irregular"],
)
def test_a_self_truncating_gym_env_trains_on_exact_final_observations(
    lengths, truncations, tmp_path, monkeypatch
):
    """DQN on a ``task=gym`` env (tests/data/self_truncating_envs.py) whose episodes the
    env truncates itself, every step, every 2 steps, or irregularly: the buffer the run
    saves gives every truncated transition its own final observation."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "data"))
    settings = {
        "task.import": "self_truncating_envs",
        "task.id": "selftrunc/SelfTruncating-v0",
        "+task.kwargs.lengths": lengths,
        "total_steps": 1000,
        "num_envs": 2,
        "algo.buffer_size": 1000,
        "algo.learning_starts": 900,
        "algo.batch_size": 8,
        "algo.hidden_sizes": [8],
        "log_every": 1000,
        "eval_every": 1000,
        "progress": "none",
    }
    result = rlspeed.train(
        algo="dqn",
        task="gym",
        backend="torch",
        env="gym-sync",
        tracking="none",
        out_dir=tmp_path / "run",
        **settings,
    )
    buffer = statefile.load(result.output_dir / RESUME_FILE)["parts"]["buffer"]
    assert _wrong_next_observations(SimpleNamespace(**buffer), 2, np) == (0, truncations)
