"""A seeded sampler that seeds each trial: the same command samples the same trials, and
a resumed study samples new ones.

A seeded Optuna sampler draws from one random stream per process. A sweep that resumes a
study (the same command run again) would start that stream afresh and propose its first
trials' values again (TPE and CMA-ES sample their startup trials at random: with seed 0,
trials 4 and 5 of a resumed study repeat trials 0 and 1), and two sweeps sharing a study
would propose the same values. So each trial gets a sampler of its own, seeded from the
configured seed and the trial's number: a trial's draws are the same on every run of the
command, whichever sweep asks for it and however the trials are batched, and differ from
every other trial's. Optuna's samplers keep what they learn from the trials in the study's
storage, not in themselves, so a fresh one per trial samples as a long-lived one would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState


def trial_seed(seed: int, number: int) -> int:
    """A seed for trial ``number`` of a sweep seeded ``seed`` (in NumPy's range). Hashed, not
    added: with ``seed + number``, seed 1's trial 0 would repeat seed 0's trial 1."""
    digest = hashlib.sha256(f"{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class TrialSeededSampler(BaseSampler):
    """``configured``, the sampler the config describes, but with ``sampler_for(number)``
    (the same, seeded for trial ``number``) sampling each trial."""

    def __init__(self, configured: BaseSampler, sampler_for: Callable[[int], BaseSampler]) -> None:
        self.configured = configured
        self._sampler_for = sampler_for
        self._samplers: dict[int, BaseSampler] = {}  # trial id -> its sampler, until told

    def _of(self, trial: FrozenTrial) -> BaseSampler:
        if trial._trial_id not in self._samplers:
            self._samplers[trial._trial_id] = self._sampler_for(trial.number)
        return self._samplers[trial._trial_id]

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._of(trial).before_trial(study, trial)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._of(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._of(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._of(trial).sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        sampler = self._of(trial)
        del self._samplers[trial._trial_id]  # the trial is told: it samples no more
        sampler.after_trial(study, trial, state, values)


def configured(sampler: BaseSampler) -> BaseSampler:
    """The sampler the config describes (a TrialSeededSampler's ``configured``)."""
    return sampler.configured if isinstance(sampler, TrialSeededSampler) else sampler
