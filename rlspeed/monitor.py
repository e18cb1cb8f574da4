"""Training metrics: episode statistics, periodic logging, evaluation and live progress.

The run (``rlspeed.run``) hands over the finished episodes of each chunk its training loop
yields, and its metrics every ``log_every`` env steps; this module turns them into the
metric names users know from CleanRL, sends them to the tracker, keeps the history for
the learning curve and draws progress (rich on a terminal, plain log lines elsewhere; the
run's log file gets the plain lines either way).

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
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlspeed.core.tasks import Policy
from rlspeed.seed_streams import RECENT_EPISODES, SeedStreams
from rlspeed.tracking import Tracker

log = logging.getLogger("rlspeed")

# Seconds between the bar's moves between logs.
BAR_REFRESH_S = 0.2


def to_log_file(message: str) -> None:
    """Write ``message`` to the run's log file (Hydra's ``rlspeed.log``) alone: what a
    terminal shows through rich (the progress bar, the summary table) is kept there as text."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, message, (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
            handler.handle(record)


class Evaluated(NamedTuple):
    """A logged row's score (the mean over seeds) and its env step."""

    score: float
    step: int


class RunMonitor:
    def __init__(
        self,
        tracker: Tracker,
        total_steps: int,
        eval_every: int,
        evaluate: Callable[[Policy, int], float],
        progress: str = "auto",
        console: Console | None = None,
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
        self.num_seeds = num_seeds
        self.streams = SeedStreams(num_seeds, eval_every)
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
        # (console log handler, its stream) while the bar shows (``_log_above_bar``).
        self._handler_streams: list[tuple[logging.StreamHandler, Any]] = []
        if mode == "rich":
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
                TextColumn("{task.fields[sps]:,.0f} steps/s"),
                TextColumn("score {task.fields[score]}"),
                TextColumn("eta {task.fields[eta]}"),
                TimeElapsedColumn(),
                console=console,
            )
            self._bar = self._progress.add_task(
                "training", total=total_steps * num_seeds, sps=0.0, score="-", eta="-"
            )
            self._progress.start()
            self._log_above_bar()
        # When the bar last moved between logs (``moved``).
        self._moved_at = 0.0

    def _log_above_bar(self) -> None:
        """Point the console's log handlers at rich's stand-ins for stdout and stderr while
        the bar shows, so that a warning prints above the bar, not into its line."""
        for handler in logging.getLogger().handlers:
            if type(handler) is not logging.StreamHandler:
                continue  # a FileHandler (the run's log file)
            for proxy in (sys.stdout, sys.stderr):
                if handler.stream is getattr(proxy, "rich_proxied_file", None):
                    self._handler_streams.append((handler, handler.setStream(proxy)))

    def moved(self, step: int, seed: int = 0) -> None:
        """Seed ``seed`` is at env step ``step``: the bar follows a few times a second
        between logs (a host-driven run logs every ``log_every`` steps, maybe a minute)."""
        if self._progress is None:
            return
        now = time.perf_counter()
        if now - self._moved_at >= BAR_REFRESH_S:
            self._moved_at = now
            completed = int(self.streams.steps.sum() - self.streams.steps[seed]) + step
            # The run's mean rate so far; a log shows the rate since the last log.
            sps = completed / max(now - self._start, 1e-9)
            total = self._grown(completed)
            self._progress.update(self._bar, completed=completed, sps=sps, total=total)

    def saving(self) -> None:
        """The run trained; its checkpoint, metrics and curve are being written."""
        self._phase("saving", "rlspeed: saving the checkpoint, metrics and learning curve")

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
        """Record seed ``seed``'s episodes that ended: arrays of any shape, ``done`` as mask."""
        self.streams.episodes(
            np.array([seed]), np.asarray(done)[None], episode_return, episode_length
        )

    def every_seed_episodes(self, done: Any, episode_return: Any, episode_length: Any) -> None:
        """Record every seed's episodes that ended: arrays [num_seeds, ...] in time order."""
        self.streams.episodes(np.arange(self.num_seeds), done, episode_return, episode_length)

    def log(
        self,
        step: int,
        updates: int,
        metrics: dict[str, float],
        policy: Policy,
        seed: int = 0,
    ) -> Evaluated | None:
        """Log seed ``seed`` at env step ``step``; when an evaluation is due, the task's
        evaluation of ``policy`` is its score. Returns the run's new score, if it has one."""
        return self.log_scored(step, updates, metrics, lambda: self._evaluate(policy, seed), seed)

    def log_scored(
        self,
        step: int,
        updates: int,
        metrics: dict[str, float],
        score: Callable[[], float],
        seed: int = 0,
    ) -> Evaluated | None:
        """``log``, with ``score()`` as the seed's score when an evaluation is due."""
        return self.log_seeds(
            np.array([seed]),
            np.array([step]),
            np.array([updates]),
            {name: np.array([value]) for name, value in metrics.items()},
            lambda: np.array([score()]),
        )

    def log_seeds(
        self,
        seeds: np.ndarray,
        steps: np.ndarray,
        updates: np.ndarray,
        metrics: dict[str, np.ndarray],
        scores: Callable[[], np.ndarray],
    ) -> Evaluated | None:
        """Log the seeds ``seeds`` at env steps ``steps``, with ``metrics`` one value per
        seed; ``scores()`` gives their scores when an evaluation is due. All seeds at one
        step (the fused path) go to the tracker in one call, their mean with them. Returns
        the run's new score (the mean over seeds once every seed has logged the step of an
        evaluation), or None."""
        rows = self.streams.rows(seeds, steps, updates, metrics, self.total_steps, scores)
        if self.num_seeds == 1:
            return self._emit(int(steps[0]), rows[0])
        evaluated = None
        for step in dict.fromkeys(steps.tolist()):  # each step once, in order
            tracked: dict[str, float] = {}
            pending = self._pending.setdefault(step, {})
            for seed, at, row in zip(seeds.tolist(), steps.tolist(), rows, strict=True):
                if at == step:
                    tracked.update({f"seed{seed}/{k}": v for k, v in row.items()})
                    self.seed_history[seed].append({"step": float(step), **row})
                    pending[seed] = row
            if len(pending) == self.num_seeds:
                del self._pending[step]
                # In seed order, whichever seed logged the step last (seed workers log in any
                # order): the same sums, to the last bit, as seeds trained one after another.
                rows_in_order = [pending[index] for index in sorted(pending)]
                evaluated = self._emit(step, _mean_and_std(rows_in_order), tracked) or evaluated
            else:
                self.tracker.log_metrics(tracked, step)
                self._show(rows[-1])
        return evaluated

    def _emit(
        self, step: int, row: dict[str, float], seed_rows: dict | None = None
    ) -> Evaluated | None:
        """Log the run's row at ``step`` (the mean over seeds where there are several, sent
        with ``seed_rows``, their own rows) and show it; its score, if it has one."""
        if "eval/score" in row:
            self.score = row["eval/score"]
        self.tracker.log_metrics({**(seed_rows or {}), **row}, step)
        self.history.append({"step": float(step), **row})
        self._show(row)
        return Evaluated(self.score, step) if "eval/score" in row else None

    @property
    def steps(self) -> int:
        """Env steps taken, summed over seeds (agent-steps)."""
        return int(self.streams.steps.sum())

    @property
    def updates(self) -> int:
        return int(self.streams.updates.sum())

    @property
    def rolling_step_reward(self) -> float:
        """Mean over seeds of the rolling step reward as of their last logs."""
        return float(np.mean(self.streams.logged_rolling))

    @property
    def recent_return(self) -> float:
        """Mean over seeds of the last episodes' return as of their last logs."""
        return float(np.mean(self.streams.logged_recent))

    def seed_summaries(self) -> list[dict[str, Any]]:
        """Each seed's score, training metrics and env steps as of its last log
        (metrics.json's ``seeds``)."""
        rolling, recent = self.streams.logged_rolling, self.streams.logged_recent
        return [
            {
                "score": float(self.streams.score[i]),
                "rolling_step_reward": float(rolling[i]),
                "recent_return": float(recent[i]),
                "env_steps": int(self.streams.steps[i]),
            }
            for i in range(self.num_seeds)
        ]

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
        # Whole batches of envs may go past total_steps: the total grows to the steps done.
        total = max(self.total_steps * self.num_seeds, self.steps)
        if self.num_seeds == 1:
            parts = [f"step {self.steps:,}/{total:,}"]
            each = ""
        else:  # progress counts every seed's steps; the rates are a seed's, as tracked
            parts = [f"step {self.steps:,}/{total:,} of {self.num_seeds} seeds"]
            each = " per seed"
        parts.append(f"{row['charts/SPS']:,.0f} steps/s{each}")
        parts.append(f"{row['charts/updates_per_second']:,.0f} updates/s{each}")
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
                self._bar,
                completed=self.steps,
                sps=row["charts/SPS"],
                score=score,
                eta=eta,
                total=self._grown(self.steps),
            )

    def _grown(self, completed: int) -> float | None:
        """The bar's total grown to the steps done where the last batch of steps went past
        ``total_steps`` (a run steps whole batches of its envs: never 300,032/300,000);
        None, as it is, elsewhere."""
        assert self._progress is not None
        total = self._progress.tasks[0].total or 0
        return float(completed) if completed > total else None

    @property
    def wall_time(self) -> float:
        return time.perf_counter() - self._start

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run continues from: every seed's counters, episode window and
        next evaluation, the rows logged so far and the training time spent."""
        return {
            "streams": self.streams.state_dict(),
            "history": self.history,
            "seed_history": self.seed_history,
            "pending": self._pending,
            "score": self.score,
            "wall_time": self.wall_time,
            "compiled_calls_s": self.compiled_calls_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streams.load_state_dict(state["streams"])
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
            for handler, stream in self._handler_streams:
                handler.setStream(stream)


def _mean_and_std(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean over seeds of each metric every seed logged, with ``<name>_std`` beside it."""
    merged: dict[str, float] = {}
    for name in rows[0]:
        values = [row[name] for row in rows if name in row]
        if len(values) == len(rows):
            merged[name] = float(np.mean(values))
            merged[f"{name}_std"] = float(np.std(values))
    return merged
