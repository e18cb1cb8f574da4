"""Training metrics: episode statistics, periodic logging, evaluation and live progress.

Algorithms hand over finished-episode statistics and call ``log`` every ``log_every``
env steps; this module turns them into the metric names users know from CleanRL,
sends them to the tracker, keeps the history for the learning curve and draws progress
(rich on a terminal, plain log lines elsewhere).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from rlspeed.errors import DivergenceError
from rlspeed.tasks import Policy
from rlspeed.tracking import Tracker

log = logging.getLogger("rlspeed")

# The seed's "rolling reward": total reward / total steps over the last 2000 episodes.
ROLLING_EPISODES = 2000


class RunMonitor:
    def __init__(
        self,
        tracker: Tracker,
        total_steps: int,
        eval_every: int,
        evaluate: Any,
        progress: str = "auto",
        console: Console | None = None,
        on_score: Callable[[float, int], None] | None = None,
    ) -> None:
        self.tracker = tracker
        self.total_steps = total_steps
        self.eval_every = eval_every
        self._evaluate = evaluate
        # Called with (score, step) after each evaluation is logged; may raise to stop the
        # run (an Optuna trial reports here and raises optuna.TrialPruned).
        self._on_score = on_score
        self.history: list[dict[str, float]] = []
        self._window: deque[tuple[float, int]] = deque(maxlen=ROLLING_EPISODES)
        self._interval_returns: list[float] = []
        self._interval_lengths: list[int] = []
        self._next_eval = eval_every
        self._start = time.perf_counter()
        self._last_time, self._last_step, self._last_updates = self._start, 0, 0
        self.steps = self.updates = 0
        self.score = math.nan
        mode = progress if progress != "auto" else ("rich" if sys.stdout.isatty() else "plain")
        self._mode = mode
        self._progress: Progress | None = None
        if mode == "rich":
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
                TextColumn("{task.fields[sps]:,.0f} steps/s"),
                TextColumn("score {task.fields[score]}"),
                TimeRemainingColumn(),
                console=console,
            )
            self._bar = self._progress.add_task("training", total=total_steps, sps=0.0, score="-")
            self._progress.start()

    def episodes(self, done: Any, episode_return: Any, episode_length: Any) -> None:
        """Record the episodes that ended: arrays of any shape, ``done`` as mask."""
        done = np.asarray(done)
        if not done.any():
            return
        returns = np.asarray(episode_return)[done].tolist()
        lengths = np.asarray(episode_length)[done].tolist()
        self._interval_returns.extend(returns)
        self._interval_lengths.extend(lengths)
        self._window.extend(zip(returns, lengths, strict=True))

    @property
    def rolling_step_reward(self) -> float:
        steps = sum(length for _, length in self._window)
        return sum(r for r, _ in self._window) / steps if steps else math.nan

    def log(self, step: int, updates: int, metrics: dict[str, float], policy: Policy) -> None:
        """Log at env step ``step``; evaluates ``policy`` when an eval is due."""
        for name, value in metrics.items():
            if name.startswith("losses/") and not math.isfinite(value):
                raise DivergenceError(
                    f"rlspeed: training diverged: {name}={value} at step {step}; "
                    "lower algo.learning_rate or check the task's rewards"
                )
        now = time.perf_counter()
        elapsed = max(now - self._last_time, 1e-9)
        row = {
            "charts/SPS": (step - self._last_step) / elapsed,
            "charts/updates_per_second": (updates - self._last_updates) / elapsed,
            "charts/gradient_updates": float(updates),
            **metrics,
        }
        if self._interval_returns:
            row["charts/episodic_return"] = float(np.mean(self._interval_returns))
            row["charts/episodic_length"] = float(np.mean(self._interval_lengths))
            row["charts/rolling_step_reward"] = self.rolling_step_reward
        self._interval_returns, self._interval_lengths = [], []
        evaluated = step >= self._next_eval or step >= self.total_steps
        if evaluated:
            self.score = float(self._evaluate(policy))
            row["eval/score"] = self.score
            while self._next_eval <= step:
                self._next_eval += self.eval_every
        self.steps, self.updates = step, updates
        # Restart the rate clock after the evaluation so it counts training alone.
        self._last_time, self._last_step, self._last_updates = time.perf_counter(), step, updates
        self.tracker.log_metrics(row, step)
        self.history.append({"step": float(step), **row})
        self._show(row)
        if evaluated and self._on_score is not None:
            self._on_score(self.score, step)

    def _show(self, row: dict[str, float]) -> None:
        score = f"{self.score:.3f}" if math.isfinite(self.score) else "-"
        if self._progress is not None:
            self._progress.update(
                self._bar, completed=self.steps, sps=row["charts/SPS"], score=score
            )
        elif self._mode == "plain":
            parts = [
                f"step {self.steps:,}/{self.total_steps:,}",
                f"{row['charts/SPS']:,.0f} steps/s",
                f"{row['charts/updates_per_second']:,.0f} updates/s",
            ]
            if "charts/episodic_return" in row:
                parts.append(f"return {row['charts/episodic_return']:.3f}")
                parts.append(f"rolling step reward {row['charts/rolling_step_reward']:.3f}")
            parts.append(f"score {score}")
            rate = self.steps / max(time.perf_counter() - self._start, 1e-9)
            parts.append(f"eta {max(self.total_steps - self.steps, 0) / max(rate, 1e-9):.0f}s")
            log.info(" | ".join(parts))

    @property
    def wall_time(self) -> float:
        return time.perf_counter() - self._start

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
