"""Training metrics: episode statistics, periodic logging, evaluation and live progress.

Algorithms hand over finished-episode statistics and call ``log`` every ``log_every``
env steps; this module turns them into the metric names users know from CleanRL,
sends them to the tracker, keeps the history for the learning curve and draws progress
(rich on a terminal, plain log lines elsewhere; the run's log file gets the plain lines
either way).

With ``num_seeds`` > 1 every seed is a stream of its own, logged as ``seed<i>/<name>``;
once every seed has logged a step, the mean over seeds goes out under the plain names
with ``<name>_std`` beside it, and the score is the mean score.
"""

from __future__ import annotations

import datetime
import logging
import math
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from rlspeed.errors import DivergenceError
from rlspeed.tasks import Policy
from rlspeed.tracking import Tracker

log = logging.getLogger("rlspeed")

# The seed's "rolling reward": total reward / total steps over the last 2000 episodes.
ROLLING_EPISODES = 2000
# SPEC §6 targets: mean return of the last 20 training episodes.
RECENT_EPISODES = 20


def to_log_file(message: str) -> None:
    """Write ``message`` to the run's log file (Hydra's ``rlspeed.log``) alone: what a
    terminal shows through rich (the progress bar, the summary table) is kept there as text."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
            handler.handle(record)


class SeedStream:
    """Metrics of one seed: its episodes, evaluations and rate clock."""

    def __init__(self, eval_every: int) -> None:
        self.eval_every = eval_every
        self.window: deque[tuple[float, int]] = deque(maxlen=ROLLING_EPISODES)
        # Finished episodes since the last log: count, total return, total length.
        self.interval = np.zeros(3)
        self.next_eval = eval_every
        self.last_time, self.last_step, self.last_updates = time.perf_counter(), 0, 0
        self.steps = self.updates = 0
        self.score = math.nan

    def episodes(self, done: Any, episode_return: Any, episode_length: Any) -> None:
        done = np.asarray(done)
        if not done.any():
            return
        returns = np.asarray(episode_return)[done]
        lengths = np.asarray(episode_length)[done]
        self.interval += (len(returns), returns.sum(), lengths.sum())
        # Fused chunks hand over many thousands of episodes; only the newest fit the window.
        recent = slice(-ROLLING_EPISODES, None)
        self.window.extend(zip(returns[recent].tolist(), lengths[recent].tolist(), strict=True))

    @property
    def rolling_step_reward(self) -> float:
        steps = sum(length for _, length in self.window)
        return sum(r for r, _ in self.window) / steps if steps else math.nan

    @property
    def recent_return(self) -> float:
        recent = list(self.window)[-RECENT_EPISODES:]
        return float(np.mean([r for r, _ in recent])) if recent else math.nan

    def row(
        self,
        step: int,
        updates: int,
        metrics: dict[str, float],
        total_steps: int,
        evaluate: Callable[[], float],
    ) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.last_time, 1e-9)
        row = {
            "charts/SPS": (step - self.last_step) / elapsed,
            "charts/updates_per_second": (updates - self.last_updates) / elapsed,
            "charts/gradient_updates": float(updates),
            **metrics,
        }
        count, total_return, total_length = self.interval
        if count:
            row["charts/episodic_return"] = float(total_return / count)
            row["charts/episodic_length"] = float(total_length / count)
            row["charts/rolling_step_reward"] = self.rolling_step_reward
            row["charts/recent_return"] = self.recent_return
        self.interval = np.zeros(3)
        if step >= self.next_eval or step >= total_steps:
            self.score = float(evaluate())
            row["eval/score"] = self.score
            while self.next_eval <= step:
                self.next_eval += self.eval_every
        self.steps, self.updates = step, updates
        # Restart the rate clock after the evaluation so it counts training alone.
        self.last_time, self.last_step, self.last_updates = time.perf_counter(), step, updates
        return row


class RunMonitor:
    def __init__(
        self,
        tracker: Tracker,
        total_steps: int,
        eval_every: int,
        evaluate: Callable[[Policy, int], float],
        progress: str = "auto",
        console: Console | None = None,
        on_score: Callable[[float, int], None] | None = None,
        num_seeds: int = 1,
        step_reward: bool = False,
    ) -> None:
        self.tracker = tracker
        # Whether the task is scored per step (Doors): the progress line then shows the
        # rolling step reward; other tasks show the return of the last episodes.
        self.step_reward = step_reward
        self.total_steps = total_steps
        # (greedy policy, seed index) -> the task's score.
        self._evaluate = evaluate
        # Called with (score, step) after each evaluation is logged; may raise to stop the
        # run (an Optuna trial reports here and raises optuna.TrialPruned).
        self._on_score = on_score
        self.num_seeds = num_seeds
        self.streams = [SeedStream(eval_every) for _ in range(num_seeds)]
        self.history: list[dict[str, float]] = []
        # num_seeds > 1: each seed's own rows, what a run stopped before every seed logged a
        # step (Ctrl-C during seed 0 of a host-driven run) still has to show.
        self.seed_history: list[list[dict[str, float]]] = [[] for _ in range(num_seeds)]
        # step -> {seed: row}, until every seed has logged that step.
        self._pending: dict[int, dict[int, dict[str, float]]] = {}
        self._start = time.perf_counter()
        # (time, steps) at this process's first log: the ETA's rate is measured from there,
        # leaving out start-up and compilation (the fused path's first call compiles the
        # whole program, seconds in which no step is counted).
        self._rate_start: tuple[float, int] | None = None
        # When compiling() was called, until the first log ends that phase.
        self._compile_start: float | None = None
        self.score = math.nan
        # Fused path: seconds spent in the compiled chunk calls (the first one compiles or
        # loads the program); the rest of the run is the host's work around them.
        self.compiled_calls_s: float | None = None
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
                TextColumn("eta {task.fields[eta]}"),
                console=console,
            )
            self._bar = self._progress.add_task(
                "training", total=total_steps * num_seeds, sps=0.0, score="-", eta="-"
            )
            self._progress.start()

    def compiling(self) -> None:
        """The run compiles its program now, before its first log (the fused path's first
        call): shown as a phase of its own until that log."""
        self._compile_start = time.perf_counter()
        self._phase("compiling", "rlspeed: compiling the training program")

    def _phase(self, name: str, line: str) -> None:
        if self._progress is not None:
            self._progress.update(self._bar, description=name)
        self._write(line)

    def _write(self, line: str) -> None:
        """A progress line: the console's and the log file's in plain mode; else (a rich bar,
        or no progress shown) the log file's alone."""
        if self._mode == "plain":
            log.info(line)
        else:
            to_log_file(line)

    def episodes(self, done: Any, episode_return: Any, episode_length: Any, seed: int = 0) -> None:
        """Record the episodes that ended: arrays of any shape, ``done`` as mask."""
        self.streams[seed].episodes(done, episode_return, episode_length)

    def log(
        self,
        step: int,
        updates: int,
        metrics: dict[str, float],
        policy: Policy,
        seed: int = 0,
        score: Callable[[], float] | None = None,
    ) -> None:
        """Log seed ``seed`` at env step ``step``. When an eval is due, ``score()`` is the
        score if given (the fused path scores every seed in one program), else the task's
        evaluation of ``policy``."""
        for name, value in metrics.items():
            if name.startswith("losses/") and not math.isfinite(value):
                raise DivergenceError(
                    f"rlspeed: training diverged: {name}={value} at step {step}"
                    + (f" (seed {seed})" if self.num_seeds > 1 else "")
                    + "; lower the algorithm's learning rate or check the task's rewards"
                )
        evaluate = score or (lambda: self._evaluate(policy, seed))
        row = self.streams[seed].row(step, updates, metrics, self.total_steps, evaluate)
        if self.num_seeds == 1:
            self._emit(step, row)
            return
        self.tracker.log_metrics({f"seed{seed}/{k}": v for k, v in row.items()}, step)
        self.seed_history[seed].append({"step": float(step), **row})
        rows = self._pending.setdefault(step, {})
        rows[seed] = row
        if len(rows) == self.num_seeds:
            del self._pending[step]
            self._emit(step, _mean_and_std(list(rows.values())))
        else:
            self._show(row)

    def _emit(self, step: int, row: dict[str, float]) -> None:
        if "eval/score" in row:
            self.score = row["eval/score"]
        self.tracker.log_metrics(row, step)
        self.history.append({"step": float(step), **row})
        self._show(row)
        if "eval/score" in row and self._on_score is not None:
            self._on_score(self.score, step)

    @property
    def steps(self) -> int:
        """Env steps taken, summed over seeds (agent-steps)."""
        return sum(s.steps for s in self.streams)

    @property
    def updates(self) -> int:
        return sum(s.updates for s in self.streams)

    @property
    def rolling_step_reward(self) -> float:
        return float(np.mean([s.rolling_step_reward for s in self.streams]))

    @property
    def recent_return(self) -> float:
        return float(np.mean([s.recent_return for s in self.streams]))

    def _eta(self) -> str:
        """Time left at the rate trained since this process's first log ("-" until known)."""
        now = time.perf_counter()
        if self._rate_start is None:
            self._rate_start = (now, self.steps)
        since, steps = self._rate_start
        if self.steps <= steps:
            return "-"
        remaining = max(self.total_steps * self.num_seeds - self.steps, 0)
        seconds = remaining * (now - since) / (self.steps - steps)
        return str(datetime.timedelta(seconds=round(seconds)))

    def _show(self, row: dict[str, float]) -> None:
        if self._compile_start is not None:  # the first log ends the compiling phase
            seconds = time.perf_counter() - self._compile_start
            self._compile_start = None
            line = f"rlspeed: compiled the program and ran its first chunk in {seconds:.1f} s"
            self._phase("training", line)
        score = f"{self.score:.3f}" if math.isfinite(self.score) else "-"
        eta = self._eta()
        parts = [f"step {self.steps:,}/{self.total_steps * self.num_seeds:,}"]
        parts.append(f"{row['charts/SPS']:,.0f} steps/s")
        parts.append(f"{row['charts/updates_per_second']:,.0f} updates/s")
        if "charts/episodic_return" in row:
            parts.append(f"return {row['charts/episodic_return']:.3f}")
            if self.step_reward:
                parts.append(f"rolling step reward {row['charts/rolling_step_reward']:.3f}")
            else:
                parts.append(f"last-{RECENT_EPISODES} return {row['charts/recent_return']:.2f}")
        parts.append(f"score {score}")
        parts.append(f"eta {eta}")
        self._write(" | ".join(parts))
        if self._progress is not None:
            self._progress.update(
                self._bar, completed=self.steps, sps=row["charts/SPS"], score=score, eta=eta
            )

    @property
    def wall_time(self) -> float:
        return time.perf_counter() - self._start

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run continues from: every seed's counters, episode window and
        next evaluation, the rows logged so far and the training time spent."""
        streams = [
            {
                "window": list(s.window),
                "interval": s.interval.copy(),
                "next_eval": s.next_eval,
                "steps": s.steps,
                "updates": s.updates,
                "score": s.score,
            }
            for s in self.streams
        ]
        return {
            "streams": streams,
            "history": self.history,
            "seed_history": self.seed_history,
            "pending": self._pending,
            "score": self.score,
            "wall_time": self.wall_time,
            "compiled_calls_s": self.compiled_calls_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for stream, saved in zip(self.streams, state["streams"], strict=True):
            stream.window.extend(saved["window"])
            stream.interval = saved["interval"].copy()
            stream.next_eval = saved["next_eval"]
            stream.steps = stream.last_step = saved["steps"]
            stream.updates = stream.last_updates = saved["updates"]
            stream.score = saved["score"]
        self.history = list(state["history"])
        self.seed_history = [list(rows) for rows in state["seed_history"]]
        self._pending = dict(state["pending"])
        self.score = state["score"]
        self.compiled_calls_s = state.get("compiled_calls_s")  # absent in older resume files
        # Rates and wall_time_s count the training time of both runs (not the gap between).
        self._start = time.perf_counter() - state["wall_time"]

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class SeedMonitor:
    """The monitor as one seed's training loop sees it."""

    def __init__(self, monitor: RunMonitor, seed: int) -> None:
        self.monitor = monitor
        self.seed = seed

    def episodes(self, done: Any, episode_return: Any, episode_length: Any) -> None:
        self.monitor.episodes(done, episode_return, episode_length, self.seed)

    def log(self, step: int, updates: int, metrics: dict[str, float], policy: Policy) -> None:
        self.monitor.log(step, updates, metrics, policy, self.seed)


class IntervalMetrics:
    """A host loop's metrics between two logs. Values stay backend scalars as they come
    (no host sync per update) and are averaged once ``log_every`` env steps have passed,
    or at the last step."""

    def __init__(self, monitor: SeedMonitor, log_every: int, total_steps: int) -> None:
        self.monitor = monitor
        self.log_every = log_every
        self.total_steps = total_steps
        self.next_log = log_every
        self.values: dict[str, list[Any]] = {}

    def add(self, metrics: dict[str, Any]) -> None:
        for name, value in metrics.items():
            self.values.setdefault(name, []).append(value)

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_log": self.next_log,
            "values": {name: [float(v) for v in vs] for name, vs in self.values.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_log = state["next_log"]
        self.values = {name: list(vs) for name, vs in state["values"].items()}

    def log_if_due(
        self, step: int, updates: int, policy: Policy, latest: dict[str, float] | None = None
    ) -> None:
        """Log the interval's means, and ``latest`` (values as of now, e.g. schedules),
        when a log is due at env step ``step``."""
        if step < self.next_log and step < self.total_steps:
            return
        metrics = dict(latest or {})
        metrics.update(
            {name: float(np.mean([float(v) for v in vs])) for name, vs in self.values.items()}
        )
        self.values = {}
        self.monitor.log(step, updates, metrics, policy)
        while self.next_log <= step:
            self.next_log += self.log_every


def _mean_and_std(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean over seeds of each metric every seed logged, with ``<name>_std`` beside it."""
    merged: dict[str, float] = {}
    for name in rows[0]:
        values = [row[name] for row in rows if name in row]
        if len(values) == len(rows):
            merged[name] = float(np.mean(values))
            merged[f"{name}_std"] = float(np.std(values))
    return merged
