"""The bounds of the sweeper's numeric settings (``Bound``): its own (n_trials, n_jobs,
heartbeat_s, ...), its samplers' and its pruners' arguments, each checked before any trial
with one line naming the key and what it allows (``check_bounds``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlspeed.config import MAX_STEPS
from rlspeed.errors import ConfigError

MAX_TRIALS = 1_000_000
MAX_BATCH = 1024
# Seconds between a sweep's heartbeats, and without one before its trials are judged stale.
MAX_HEARTBEAT_S = 3600
MAX_GRACE_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Bound:
    """The values a numeric setting takes: ``low`` to ``high``, ``low`` itself excluded
    where ``open_low``; ``auto`` too where ``auto`` (Optuna then works it out)."""

    low: float
    high: float
    integer: bool = True
    open_low: bool = False
    auto: bool = False
    # What else is allowed or why, appended to the line.
    note: str = ""

    def allows(self, value: Any) -> bool:
        if self.auto and value == "auto":
            return True
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        above = value > self.low if self.open_low else value >= self.low
        return above and value <= self.high  # NaN is neither

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        low, high = (f"{int(x):,}" if x == int(x) else f"{x:g}" for x in (self.low, self.high))
        text = f"{kind} in {'(' if self.open_low else '['}{low}, {high}]{self.note}"
        return f"auto or {text}" if self.auto else text


def check_bounds(prefix: str, values: Mapping[str, Any], bounds: dict[str, Bound]) -> None:
    """Raise ConfigError for the first of ``values`` (null: the default, allowed) outside its
    bound; ``prefix`` + key is its key on the command line."""
    for key, bound in bounds.items():
        value = values.get(key)
        if value is not None and not bound.allows(value):
            raise ConfigError(f"{prefix}{key}", value, str(bound))


# The samplers' and pruners' numeric arguments, by name (every sampler and pruner option has
# its own: tests/test_bad_input.py checks each is here). Optuna checks few of them, some
# only in a trial (a negative n_startup_trials ran as 0), and none has an upper bound.
SAMPLER_BOUNDS = {
    "seed": Bound(0, 2**32 - 1),  # NumPy's random state
    "n_startup_trials": Bound(0, MAX_TRIALS),
    # Candidates drawn for each parameter of each trial, each scored against every trial.
    "n_ei_candidates": Bound(1, 10_000),
    "prior_weight": Bound(0, 1_000_000, integer=False, open_low=True),
    "sigma0": Bound(0, 1_000_000, integer=False, open_low=True),
    "popsize": Bound(2, 10_000),  # CMA-ES recombines the better half: at least 1
    "inc_popsize": Bound(-1, 100, note=" (-1: not set; Optuna >= 4.4 ignores it)"),
    "population_size": Bound(2, 10_000),
    "mutation_prob": Bound(0, 1, integer=False),
    "crossover_prob": Bound(0, 1, integer=False),
    "swapping_prob": Bound(0, 1, integer=False),
}
PRUNER_BOUNDS = {
    "n_startup_trials": Bound(0, MAX_TRIALS),
    "n_warmup_steps": Bound(0, MAX_STEPS),
    "interval_steps": Bound(1, MAX_STEPS),
    "n_min_trials": Bound(1, MAX_TRIALS),
    # Resources are env steps; rungs grow by reduction_factor from min_resource.
    "min_resource": Bound(1, MAX_STEPS, auto=True),
    "max_resource": Bound(1, MAX_STEPS, auto=True),
    "reduction_factor": Bound(2, 1000),
    "bootstrap_count": Bound(0, MAX_TRIALS),
    # The first rung is at min_resource * reduction_factor ** rate env steps: past 30 even
    # 1 * 2 ** rate is beyond any budget (MAX_STEPS), and no trial would be pruned.
    "min_early_stopping_rate": Bound(0, 30),
}


def sweeper_bounds(heartbeat_s: int) -> dict[str, Bound]:
    """The sweeper's own settings (its grace_s bound depends on its heartbeat_s)."""
    return {
        # Every trial is a record in the study's storage; a batch of n_jobs trials is asked
        # (and held as RUNNING) at once.
        "n_trials": Bound(0, MAX_TRIALS),
        "n_jobs": Bound(1, MAX_BATCH, note=" or null (the launcher's n_jobs)"),
        "batch_size": Bound(1, MAX_BATCH),
        "max_failure_rate": Bound(0, 1, integer=False),
        "report_every": Bound(1, MAX_STEPS),
        "heartbeat_s": Bound(1, MAX_HEARTBEAT_S),
        # A grace within one heartbeat would judge live trials stale.
        "grace_s": Bound(2 * heartbeat_s, MAX_GRACE_S, note=" (at least 2 * heartbeat_s)"),
    }
