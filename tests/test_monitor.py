"""What a host training loop logs between two logs (``IntervalMetrics``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlspeed.monitor import IntervalMetrics, RunMonitor, SeedMonitor
from rlspeed.tracking.none import NoTracker


def test_logs_the_interval_means_once_per_crossing_and_at_the_last_step():
    run = RunMonitor(
        NoTracker(), 1000, eval_every=1000, evaluate=lambda policy, seed: 0.5, progress="none"
    )
    interval = IntervalMetrics(SeedMonitor(run, 0), log_every=300, total_steps=1000)
    # 700 passes both 300 and 600 (one log), 800 is short of the next (900), 1000 is the end.
    for step in (100, 200, 700, 800, 1000):
        interval.add({"losses/loss": torch.tensor(float(step))})  # a backend scalar, as kept
        interval.log_if_due(step, step // 10, np.argmax, {"charts/epsilon": step / 1000})
    assert [row["step"] for row in run.history] == [700, 1000]
    first, last = run.history
    assert first["losses/loss"] == pytest.approx((100 + 200 + 700) / 3)
    assert last["losses/loss"] == pytest.approx((800 + 1000) / 2)
    assert (first["charts/epsilon"], last["charts/epsilon"]) == (0.7, 1.0)
    assert (first["charts/gradient_updates"], last["charts/gradient_updates"]) == (70, 100)
    assert "eval/score" not in first and last["eval/score"] == 0.5
