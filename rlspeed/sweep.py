"""The job side of an Optuna sweep: a run that is a study's trial reports its score to it.

The Optuna sweeper (``hydra/sweeper=optuna``) asks the study for trials and launches one job
per trial with ``trial.storage``, ``trial.study_name`` and ``trial.number`` set. Jobs may run
in other processes (``hydra/launcher=joblib``) or on other machines, so a job attaches to its
trial through the study's storage, reports every evaluation to it and stops as soon as the
study's pruner says so. The sweeper records the pruner it uses in the study (system
attribute ``PRUNER_ATTR``) because a pruner is not part of a study's storage.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("rlspeed")

# Study system attribute holding the pruner's config (a dict with ``_target_``).
PRUNER_ATTR = "rlspeed:pruner"
JOURNAL_PREFIX = "journal:"


def journal_path(spec: str) -> Path | None:
    """The journal file a storage string names, or None for a database URL.

    ``journal:PATH`` or a path ending in ``.journal`` is an Optuna journal file (safe for
    several processes on one machine, no database needed); anything else is an RDB URL
    such as ``sqlite:///study.db`` or ``postgresql://host/db``.
    """
    if spec.startswith(JOURNAL_PREFIX) or spec.endswith(".journal"):
        return Path(spec.removeprefix(JOURNAL_PREFIX)).expanduser().absolute()
    return None


def open_storage(spec: str) -> Any:
    """An Optuna storage from a string: a journal file or a database URL (journal_path)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    path = journal_path(spec)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    return optuna.storages.RDBStorage(spec)


class TrialReporter:
    """Reports a run's evaluations to its Optuna trial; raises ``optuna.TrialPruned`` when
    the study's pruner stops it."""

    def __init__(self, trial: Any, total_steps: int) -> None:
        self.trial = trial
        self.total_steps = total_steps

    @classmethod
    def attach(cls, cfg: Any) -> TrialReporter | None:
        """The reporter of the trial ``cfg.trial`` names, or None for a run outside a study."""
        spec = cfg.trial
        if spec.number is None:
            return None
        import optuna
        from hydra.utils import instantiate

        if not spec.storage or not spec.study_name:
            raise ValueError("trial.number needs trial.storage and trial.study_name")
        storage = open_storage(spec.storage)
        study_id = storage.get_study_id_from_name(spec.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, spec.number)
        pruner_cfg = storage.get_study_system_attrs(study_id).get(PRUNER_ATTR)
        pruner = instantiate(pruner_cfg) if pruner_cfg else optuna.pruners.NopPruner()
        # The job never samples: a random sampler keeps attaching cheap.
        study = optuna.load_study(
            study_name=spec.study_name,
            storage=storage,
            sampler=optuna.samplers.RandomSampler(),
            pruner=pruner,
        )
        if len(study.directions) > 1:  # Optuna cannot prune multi-objective trials
            return None
        return cls(optuna.trial.Trial(study, trial_id), cfg.total_steps)

    @property
    def pruned_error(self) -> type[Exception]:
        """What ``report`` raises when the pruner stops the run."""
        import optuna

        return optuna.TrialPruned

    def report(self, score: float, step: int) -> None:
        """Record ``score`` at env step ``step``; stop the run if the pruner says so."""
        import optuna

        self.trial.report(score, step)
        # The last evaluation is the trial's result: nothing is left to save by stopping.
        if step < self.total_steps and self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step:,} (score {score:.4f})")
