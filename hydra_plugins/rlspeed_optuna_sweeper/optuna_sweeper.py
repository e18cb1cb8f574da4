"""``hydra/sweeper=optuna``: the Hydra sweeper plugin (the work is in ``_sweep``).

Hydra imports this module on every start to discover plugins, so Optuna is imported only
when a sweep actually runs.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

# Registers hydra/sweeper=optuna and its sampler and pruner groups with Hydra's ConfigStore.
from hydra_plugins.rlspeed_optuna_sweeper import config as _config  # noqa: F401


class OptunaSweeper(Sweeper):
    def __init__(
        self,
        sampler: Any,
        pruner: Any,
        direction: Any,
        objectives: Any,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int | None,
        batch_size: int,
        max_failure_rate: float,
        params: Any,
        search_space: Any,
        custom_search_space: str | None,
        report_every: int | None,
        heartbeat_s: int,
        grace_s: int,
        keep_resume: bool,
        enqueue_defaults: bool,
    ) -> None:
        # The settings are read back from the composed config's hydra.sweeper node, where
        # the pre-flight check reads them too; the arguments are what Hydra passes.
        from hydra_plugins.rlspeed_optuna_sweeper._sweep import OptunaSweeperImpl

        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher = None
        self._impl = OptunaSweeperImpl()

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self._impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = self._impl.launcher

    def sweep(self, arguments: list[str]) -> Any:
        from rlspeed.errors import RLSpeedError

        try:
            return self._impl.sweep(arguments, legal=lambda overrides: self._legal(overrides))
        except RLSpeedError as error:
            # One line, exit 1: Hydra would add a line on HYDRA_FULL_ERROR after it.
            print(error, file=sys.stderr)
            sys.exit(1)

    def _legal(self, overrides: list[str]) -> None:
        self.validate_batch_is_legal([overrides])
