"""What a training loop does with the metrics it logs: stop the run on a loss that is not
finite (``DivergenceError``), hand the rest to the monitor (tracker, history, progress), and
report each new score to the run's Optuna trial, whose pruner may stop the run there
(``optuna.TrialPruned``). A host loop keeps its metrics between logs in ``IntervalMetrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlspeed.context import RunContext
from rlspeed.errors import DivergenceError
from rlspeed.monitor import Evaluated
from rlspeed.tasks import Policy


def log_seeds(
    ctx: RunContext,
    seeds: np.ndarray,
    steps: np.ndarray,
    updates: np.ndarray,
    metrics: dict[str, np.ndarray],
    scores: Callable[[], np.ndarray],
) -> None:
    """Log seeds ``seeds`` at env steps ``steps`` (``RunMonitor.log_seeds``), after checking
    their losses, and report the run's new score."""
    check_finite(metrics, seeds, steps, ctx.cfg.num_seeds)
    report(ctx, ctx.run_monitor.log_seeds(seeds, steps, updates, metrics, scores))


def log_seed(
    ctx: RunContext, step: int, updates: int, metrics: dict[str, float], policy: Policy
) -> None:
    """Log the context's seed at env step ``step``; ``policy`` is evaluated when due."""
    seed = ctx.seed_index
    check_finite(metrics, [seed], [step], ctx.cfg.num_seeds)
    report(ctx, ctx.run_monitor.log(step, updates, metrics, policy, seed))


def check_finite(metrics: dict[str, Any], seeds: Any, steps: Any, num_seeds: int) -> None:
    """Raise DivergenceError at the first loss (``losses/...``) that is not finite; a metric
    is a value per seed of ``seeds`` (an array), or one number where one seed logs."""
    for name, value in metrics.items():
        if not name.startswith("losses/"):
            continue
        values = np.atleast_1d(value)
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            seed = int(seeds[bad[0]])
            raise DivergenceError(
                f"rlspeed: training diverged: {name}={values[bad[0]]} at step "
                f"{steps[bad[0]]}"
                + (f" (seed {seed})" if num_seeds > 1 else "")
                + "; lower the algorithm's learning rate or check the task's rewards"
            )


def report(ctx: RunContext, evaluated: Evaluated | None) -> None:
    """Hand a new score to the run's trial (``RunContext.report_score``), if it has one."""
    if evaluated is not None and ctx.report_score is not None:
        ctx.report_score(evaluated.score, evaluated.step)


class IntervalMetrics:
    """A host loop's metrics between two logs. Values stay backend scalars as they come
    (no host sync per update) and are averaged once ``log_every`` env steps have passed,
    or at the last step."""

    def __init__(
        self,
        log: Callable[[int, int, dict[str, float], Policy], None],
        log_every: int,
        total_steps: int,
    ) -> None:
        # (step, updates, metrics, greedy policy): ``log_seed`` of the loop's context.
        self.log = log
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
        self.log(step, updates, metrics, policy)
        while self.next_log <= step:
            self.next_log += self.log_every
