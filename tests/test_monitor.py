"""What the monitor keeps and logs: a host loop's interval means (``IntervalMetrics``), and
every seed's episodes and rows at once (the fused path)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlspeed import statefile
from rlspeed.config import ROLLING_EPISODES
from rlspeed.core.algos.loops.host import IntervalMetrics
from rlspeed.monitor import RunMonitor
from rlspeed.recording import write_metrics
from rlspeed.seed_streams import RECENT_EPISODES
from rlspeed.tracking.none import NoTracker


def test_logs_the_interval_means_once_per_crossing_and_at_the_last_step():
    run = RunMonitor(
        NoTracker(), 1000, eval_every=1000, evaluate=lambda policy, seed: 0.5, progress="none"
    )
    interval = IntervalMetrics(log_every=300, total_steps=1000)
    # 700 passes both 300 and 600 (one log), 800 is short of the next (900), 1000 is the end.
    for step in (100, 200, 700, 800, 1000):
        interval.add({"losses/loss": torch.tensor(float(step))})  # a backend scalar, as kept
        due = interval.due(step, {"charts/epsilon": step / 1000})
        if due is not None:
            run.log(step, step // 10, due, np.argmax)
    assert [row["step"] for row in run.history] == [700, 1000]
    first, last = run.history
    assert first["losses/loss"] == pytest.approx((100 + 200 + 700) / 3)
    assert last["losses/loss"] == pytest.approx((800 + 1000) / 2)
    assert (first["charts/epsilon"], last["charts/epsilon"]) == (0.7, 1.0)
    assert (first["charts/gradient_updates"], last["charts/gradient_updates"]) == (70, 100)
    assert "eval/score" not in first and last["eval/score"] == 0.5


def _reference_window(episodes: list[tuple[float, int]]) -> tuple[float, float]:
    """Rolling step reward over the last ROLLING_EPISODES and mean of the last RECENT."""
    window = episodes[-ROLLING_EPISODES:]
    recent = [r for r, _ in window[-RECENT_EPISODES:]]
    return sum(r for r, _ in window) / sum(n for _, n in window), float(np.mean(recent))


def test_every_seed_episodes_keep_each_seeds_newest_in_order_across_a_resume(tmp_path):
    """All seeds' chunk stats at once (the fused path) keep what one stream per seed kept:
    each seed's episodes in time order, its newest ROLLING_EPISODES, the same again after
    the state goes through a resume file."""
    rng = np.random.default_rng(0)
    seeds, monitor = 3, _monitor(3)
    seen: list[list[tuple[float, int]]] = [[] for _ in range(seeds)]
    for chunk, (iterations, envs) in enumerate([(7, 4), (900, 8), (3, 2), (40, 64)]):
        done = rng.random((seeds, iterations, envs)) < 0.3
        done[1] = done[1] & (chunk != 2)  # seed 1 ends no episode in chunk 2
        returns = rng.normal(size=done.shape).astype(np.float32)
        lengths = rng.integers(1, 500, size=done.shape)
        monitor.every_seed_episodes(done, returns, lengths)
        for s in range(seeds):
            ended = returns[s][done[s]].tolist(), lengths[s][done[s]].tolist()
            seen[s] += list(zip(*ended, strict=True))
        if chunk == 1:  # resume from here
            with open(tmp_path / "state.npz", "wb") as file:
                statefile.dump(monitor.state_dict(), file)
            state = statefile.load(tmp_path / "state.npz")
            monitor = _monitor(seeds)
            monitor.load_state_dict(state)
        streams = monitor.streams
        for s in range(seeds):
            rolling, recent = _reference_window(seen[s])
            assert streams.rolling_step_reward()[s] == pytest.approx(rolling, rel=1e-12)
            assert streams.recent_return()[s] == pytest.approx(recent, rel=1e-12)
    windows = [dict(seed)["window"] for seed in monitor.streams.state_dict()]
    assert windows == [[(float(np.float32(r)), n) for r, n in s[-ROLLING_EPISODES:]] for s in seen]


def _monitor(seeds: int) -> RunMonitor:
    return RunMonitor(
        NoTracker(), 10**6, eval_every=10**6, evaluate=lambda p, s: 0.0, progress="none",
        num_seeds=seeds,
    )  # fmt: skip


def test_all_seeds_log_in_one_tracker_call_with_their_mean():
    """The fused path logs every seed at once: one row per seed (seed<i>/...) and their
    mean and spread, in one call; a due evaluation asks for every seed's score once."""
    calls: list[dict[str, float]] = []

    class Recorder(NoTracker):
        def log_metrics(self, metrics, step):
            calls.append(dict(metrics))

    asked = []
    monitor = RunMonitor(
        Recorder(), 100, eval_every=100, evaluate=None, progress="none", num_seeds=2
    )
    monitor.every_seed_episodes(
        np.array([[True, False], [False, False]]), np.array([[2.0, 9.0], [5.0, 5.0]]),
        np.array([[4, 1], [1, 1]]),
    )  # fmt: skip
    scores = lambda: asked.append(1) or np.array([0.25, 0.75])  # noqa: E731
    loss = {"losses/loss": np.array([1.0, 3.0])}
    monitor.log_seeds(np.arange(2), np.array([100, 100]), np.array([7, 7]), loss, scores)
    assert len(calls) == 1 and asked == [1]
    row = calls[0]
    assert (row["seed0/losses/loss"], row["seed1/losses/loss"], row["losses/loss"]) == (1, 3, 2)
    assert row["losses/loss_std"] == 1.0
    assert (row["seed0/eval/score"], row["seed1/eval/score"], row["eval/score"]) == (
        0.25, 0.75, 0.5
    )  # fmt: skip
    # Seed 1 ended no episode: it has no episodic return, so the mean row has none either.
    assert row["seed0/charts/episodic_return"] == 2.0
    assert "seed1/charts/episodic_return" not in row and "charts/episodic_return" not in row
    assert monitor.score == 0.5 and [r["step"] for r in monitor.history] == [100]
    assert [len(rows) for rows in monitor.seed_history] == [1, 1]


def test_a_run_stopped_before_its_first_log_writes_strict_json(tmp_path):
    """metrics.json of a run stopped at step 0: no NaN (not JSON), and no episode
    statistics beside env_steps 0 (the summary goes with the steps of the last log)."""
    monitor = _monitor(1)
    monitor.episodes(np.array([True, False]), np.array([3.0, 1.0]), np.array([10, 2]))
    path = write_metrics(monitor, tmp_path / "metrics.json", "KILLED", [], None)
    summary = json.loads(path.read_text(), parse_constant=lambda word: pytest.fail(word))
    assert summary["env_steps"] == 0 and summary["score"] is None
    assert summary["rolling_step_reward"] is None and summary["recent_return"] is None
