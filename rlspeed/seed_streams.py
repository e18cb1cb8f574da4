"""Every seed's metrics as arrays over seeds (``SeedStreams``): the episodes that ended, the
rolling window of the last episodes, the log interval's sums, when the next evaluation is
due and the clocks of the rates. ``rlspeed.monitor`` logs the rows they make.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlspeed.config import ROLLING_EPISODES

# SPEC §6 targets: mean return of the last 20 training episodes.
RECENT_EPISODES = 20


def evaluation_due(steps: Any, next_eval: Any, total_steps: int) -> Any:
    """Whether a seed's log at env step ``steps`` has an evaluation: it reached its next
    evaluation (``next_eval``) or the run's last step. Arrays over seeds, or one seed's ints
    (a seed worker's, which evaluates where the run's monitor will want its score)."""
    return (steps >= next_eval) | (steps >= total_steps)


def next_evaluation(steps: Any, next_eval: Any, eval_every: int) -> Any:
    """A seed's next evaluation after one at env step ``steps``: the next multiple of
    ``eval_every`` after the step where ``next_eval`` (one) has passed; else (the evaluation
    of the last step) ``next_eval`` as it was."""
    return np.where(next_eval <= steps, (steps // eval_every + 1) * eval_every, next_eval)


class SeedStreams:
    """Metrics of every seed as arrays over seeds: episodes, evaluations, rate clocks. The
    fused path hands over all seeds at once, so a chunk costs the host a few NumPy calls
    whatever the number of seeds; a host loop hands over one seed at a time."""

    def __init__(self, num_seeds: int, eval_every: int) -> None:
        self.eval_every = eval_every
        # The last ROLLING_EPISODES episodes of each seed (return, length), a ring per seed:
        # ``window_head`` is the slot the next episode goes to; slots never written hold 0.
        self.window = np.zeros((num_seeds, 2, ROLLING_EPISODES))
        self.window_head = np.zeros(num_seeds, dtype=np.int64)
        self.window_count = np.zeros(num_seeds, dtype=np.int64)
        # Finished episodes since the last log: count, total return, total length.
        self.interval = np.zeros((num_seeds, 3))
        self.next_eval = np.full(num_seeds, eval_every, dtype=np.int64)
        self.last_time = np.full(num_seeds, time.perf_counter())
        self.last_step = np.zeros(num_seeds, dtype=np.int64)
        self.last_updates = np.zeros(num_seeds, dtype=np.int64)
        self.steps = np.zeros(num_seeds, dtype=np.int64)
        self.updates = np.zeros(num_seeds, dtype=np.int64)
        self.score = np.full(num_seeds, math.nan)
        # The windows' rolling step reward and recent return as of each seed's last log: a
        # run's summary goes with the steps counted then, not with episodes seen since.
        self.logged_rolling = np.full(num_seeds, math.nan)
        self.logged_recent = np.full(num_seeds, math.nan)

    def episodes(self, seeds: np.ndarray, done: Any, episode_return: Any, length: Any) -> None:
        """Record the episodes that ended: arrays [len(seeds), ...] in time order (the
        iteration axis before the env axis), ``done`` as mask."""
        k = len(seeds)
        done = np.asarray(done, dtype=bool).reshape(k, -1)
        counts = done.sum(axis=1)
        if not counts.any():
            return
        returns = np.asarray(episode_return, dtype=np.float64).reshape(k, -1)
        lengths = np.asarray(length, dtype=np.float64).reshape(k, -1)
        sums = [np.where(done, returns, 0.0).sum(axis=1), np.where(done, lengths, 0.0).sum(axis=1)]
        self.interval[seeds] += np.stack([counts, *sums], axis=1)
        # Fused chunks hand over many thousands of episodes; only each seed's newest
        # ROLLING_EPISODES fit its window. ``order``: an episode's place among its seed's.
        row, column = np.nonzero(done)
        order = np.arange(len(row)) - (np.cumsum(counts) - counts)[row]
        dropped = np.maximum(counts - ROLLING_EPISODES, 0)
        kept = order >= dropped[row]
        row, column, order = row[kept], column[kept], order[kept] - dropped[row[kept]]
        slot = (self.window_head[seeds][row] + order) % ROLLING_EPISODES
        self.window[seeds[row], 0, slot] = returns[row, column]
        self.window[seeds[row], 1, slot] = lengths[row, column]
        added = np.minimum(counts, ROLLING_EPISODES)
        self.window_head[seeds] = (self.window_head[seeds] + added) % ROLLING_EPISODES
        self.window_count[seeds] = np.minimum(self.window_count[seeds] + added, ROLLING_EPISODES)

    def _oldest_first(self, seeds: Any) -> np.ndarray:
        """The seeds' windows [seeds, 2, ROLLING_EPISODES], oldest episode first (unwritten
        slots, zeros, before them): sums then add in the same order after a resume."""
        slots = (self.window_head[seeds, None] + np.arange(ROLLING_EPISODES)) % ROLLING_EPISODES
        return np.take_along_axis(self.window[seeds], slots[:, None, :], axis=2)

    def rolling_step_reward(self, seeds: Any = slice(None)) -> np.ndarray:
        """Total reward / total steps over each seed's window (NaN before its first episode)."""
        total_return, total_length = self._oldest_first(seeds).sum(axis=2).T
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total_length > 0, total_return / total_length, math.nan)

    def recent_return(self, seeds: Any = slice(None)) -> np.ndarray:
        """Mean return of each seed's last RECENT_EPISODES episodes (NaN before the first)."""
        recent = self._oldest_first(seeds)[:, 0, -RECENT_EPISODES:].sum(axis=1)
        count = np.minimum(self.window_count[seeds], RECENT_EPISODES)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(count > 0, recent / count, math.nan)

    def rows(
        self,
        seeds: np.ndarray,
        steps: np.ndarray,
        updates: np.ndarray,
        metrics: dict[str, np.ndarray],
        total_steps: int,
        evaluate: Callable[[], np.ndarray],
    ) -> list[dict[str, float]]:
        """The logged row of each seed in ``seeds`` at env steps ``steps`` (one per seed).
        ``evaluate()``: the seeds' scores, called once if an evaluation is due for any."""
        elapsed = np.maximum(time.perf_counter() - self.last_time[seeds], 1e-9)
        columns = {
            "charts/SPS": (steps - self.last_step[seeds]) / elapsed,
            "charts/updates_per_second": (updates - self.last_updates[seeds]) / elapsed,
            "charts/gradient_updates": updates.astype(np.float64),
            **metrics,
        }
        count, total_return, total_length = self.interval[seeds].T
        episodes = count > 0
        self.logged_rolling[seeds] = self.rolling_step_reward(seeds)
        self.logged_recent[seeds] = self.recent_return(seeds)
        if episodes.any():
            with np.errstate(divide="ignore", invalid="ignore"):
                columns["charts/episodic_return"] = total_return / count
                columns["charts/episodic_length"] = total_length / count
            columns["charts/rolling_step_reward"] = self.logged_rolling[seeds]
            columns["charts/recent_return"] = self.logged_recent[seeds]
        self.interval[seeds] = 0.0
        next_eval = self.next_eval[seeds]
        due = evaluation_due(steps, next_eval, total_steps)
        if due.any():
            self.score[seeds[due]] = np.asarray(evaluate(), dtype=np.float64)[due]
            columns["eval/score"] = self.score[seeds]
            self.next_eval[seeds] = next_evaluation(steps, next_eval, self.eval_every)
        episodic = (
            "charts/episodic_return",
            "charts/episodic_length",
            "charts/rolling_step_reward",
            "charts/recent_return",
        )
        rows = []
        for index in range(len(seeds)):
            row = {}
            for name, values in columns.items():
                if name in episodic and not episodes[index]:
                    continue
                if name == "eval/score" and not due[index]:
                    continue
                row[name] = float(values[index])
            rows.append(row)
        self.steps[seeds], self.updates[seeds] = steps, updates
        # Restart the rate clocks after the evaluation so they count training alone.
        self.last_time[seeds] = time.perf_counter()
        self.last_step[seeds], self.last_updates[seeds] = steps, updates
        return rows

    def state_dict(self) -> list[dict[str, Any]]:
        """Per seed, as resume files have held it: the window as (return, length) pairs."""
        windows = self._oldest_first(slice(None))
        return [
            {
                "window": [
                    (float(r), int(n))
                    for r, n in windows[i, :, ROLLING_EPISODES - self.window_count[i] :].T
                ],
                "interval": self.interval[i].copy(),
                "next_eval": int(self.next_eval[i]),
                "steps": int(self.steps[i]),
                "updates": int(self.updates[i]),
                "score": float(self.score[i]),
                "logged_rolling_step_reward": float(self.logged_rolling[i]),
                "logged_recent_return": float(self.logged_recent[i]),
            }
            for i in range(len(self.steps))
        ]

    def load_state_dict(self, streams: list[dict[str, Any]]) -> None:
        for i, saved in enumerate(streams):
            window = np.asarray(saved["window"], dtype=np.float64).reshape(-1, 2)
            window = window[-ROLLING_EPISODES:]
            self.window[i] = 0.0
            self.window[i, :, : len(window)] = window.T
            self.window_head[i] = len(window) % ROLLING_EPISODES
            self.window_count[i] = len(window)
            self.interval[i] = saved["interval"]
            self.next_eval[i] = saved["next_eval"]
            self.steps[i] = self.last_step[i] = saved["steps"]
            self.updates[i] = self.last_updates[i] = saved["updates"]
            self.score[i] = saved["score"]
            # Absent from resume files written before the summary used them.
            self.logged_rolling[i] = saved.get("logged_rolling_step_reward", math.nan)
            self.logged_recent[i] = saved.get("logged_recent_return", math.nan)
