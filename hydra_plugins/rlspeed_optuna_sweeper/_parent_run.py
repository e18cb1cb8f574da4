"""The study's MLflow parent run (``StudyRun``): the trials' runs nest under it, it gets
the study's results at the end, and resuming the study reuses it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hydra_plugins.rlspeed_optuna_sweeper._results import best_trials, trial_counts
from hydra_plugins.rlspeed_optuna_sweeper._seeding import configured
from rlspeed import secrets

log = logging.getLogger(__name__)

# Study system attribute: the MLflow parent run of the study, per tracking store.
PARENT_ATTR = "rlspeed:mlflow_parent"


class StudyRun:
    """The study's MLflow parent run: trials nest under it; it gets the results at the end.

    Resuming a study reuses its parent run. MLflow params cannot change once logged, so the
    best params are logged as params (``best.<name>``) the first time and kept current as
    tags of the same names; ``best_value`` is a metric stepped by the finished trial count.
    """

    def __init__(self, client: Any, run_id: str, links: dict[str, str]) -> None:
        self.client = client
        self.run_id = run_id
        # Where to see it (rlspeed.tracking.mlflow.run_links), for the sweep's last lines.
        self.links = links
        # Why something could not be sent to the parent run (None while all was).
        self.failure: str | None = None

    @classmethod
    def open(
        cls, tracking: DictConfig, study: Any, study_id: int, storage: Any, storage_spec: str
    ) -> StudyRun:
        from rlspeed.tracking._environment import environment_tags
        from rlspeed.tracking.mlflow import (
            experiment_id,
            mlflow_client,
            resolve_uri,
            run_links,
            server_credentials,
            use_mlflow_defaults,
        )

        use_mlflow_defaults()
        import mlflow

        uri = resolve_uri(tracking)
        bare_uri, credentials = server_credentials(uri)
        os.environ.update(credentials)  # where MLflow reads a server's user and password
        client = mlflow_client(bare_uri or mlflow.get_tracking_uri())
        study_experiment = experiment_id(client, tracking.experiment)

        def links(run_id: str) -> dict[str, str]:
            return run_links(bare_uri or mlflow.get_tracking_uri(), study_experiment, run_id)

        # Recorded in the study: without a server's user and password, a database's masked.
        where = {"uri": secrets.mask(bare_uri or ""), "experiment": tracking.experiment}
        known = storage.get_study_system_attrs(study_id).get(PARENT_ATTR)
        if known and {k: known.get(k) for k in where} == where:
            try:
                run = client.get_run(known["run_id"])
                if run.info.lifecycle_stage == "active":
                    client.update_run(run.info.run_id, status="RUNNING")
                    log.info("MLflow: resuming the study's parent run %s", run.info.run_id)
                    return cls(client, run.info.run_id, links(run.info.run_id))
            except Exception:  # noqa: BLE001 - deleted or gone: start a new parent run
                pass
        sampler = type(configured(study.sampler)).__name__
        pruner = type(study.pruner).__name__
        run = client.create_run(
            study_experiment,
            run_name=study.study_name,
            tags={
                **environment_tags(sys.argv),
                "optuna.study": study.study_name,
                "optuna.storage": secrets.mask(storage_spec),
                "optuna.sampler": sampler,
                "optuna.pruner": pruner,
                "optuna.directions": ",".join(d.name.lower() for d in study.directions),
            },
        )
        storage.set_study_system_attr(study_id, PARENT_ATTR, {**where, "run_id": run.info.run_id})
        log.info("MLflow: study parent run %s", run.info.run_id)
        return cls(client, run.info.run_id, links(run.info.run_id))

    def _try(self, what: str, send: Callable[[], None]) -> None:
        """``send()``, or, if the tracking store fails, one warning: a store that dies
        mid-sweep costs its copy of the results, not the sweep."""
        from rlspeed.tracking import cause

        try:
            send()
        except Exception as error:  # noqa: BLE001 - MLflow raises its own and requests' errors
            if self.failure is None:
                log.warning(
                    "MLflow: could not %s (%s); the sweep goes on, its results are in the "
                    "study and the sweep folder",
                    what,
                    cause(error),
                )
            self.failure = f"{what} ({cause(error)})"

    def fail_stale_children(self, numbers: list[int]) -> None:
        """Child runs of trials a killed sweep left running end FAILED, like their trials."""
        if numbers:
            self._try("end stale trials' runs", lambda: self._fail_children(numbers))

    def _fail_children(self, numbers: list[int]) -> None:
        run = self.client.get_run(self.run_id)
        children = self.client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.run_id}' "
            "and attributes.status = 'RUNNING'",
        )
        for child in children:
            if child.data.tags.get("optuna.trial") in {str(n) for n in numbers}:
                self.client.set_terminated(child.info.run_id, status="FAILED")

    def finish(self, study: Any, files: list[Path], status: str) -> None:
        """The study's results and files into the parent run, which then ends."""
        self._try("record the study's results", lambda: self._log_results(study, files))
        self._try("end the study's run", lambda: self.client.set_terminated(self.run_id, status))

    def _log_results(self, study: Any, files: list[Path]) -> None:
        client, run_id = self.client, self.run_id
        counts = trial_counts(study)
        step = sum(counts.values())
        for state, count in counts.items():
            client.log_metric(run_id, f"trials_{state.lower()}", count, step=step)
        best = best_trials(study)
        if best and len(study.directions) == 1:
            trial = best[0]
            client.log_metric(run_id, "best_value", trial.value, step=step)
            client.set_tag(run_id, "best_trial", str(trial.number))
            logged = client.get_run(run_id).data.params
            for name, value in trial.params.items():
                key = f"best.{name}"
                if key not in logged:
                    client.log_param(run_id, key, value)
                client.set_tag(run_id, key, str(value))
        elif best:
            client.set_tag(run_id, "pareto_front", ",".join(str(t.number) for t in best))
        for path in files:
            client.log_artifact(
                run_id,
                str(path),
                artifact_path="plots" if path.parent.name == "plots" else None,
            )
