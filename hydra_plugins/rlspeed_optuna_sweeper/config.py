"""Config schema of ``hydra/sweeper=optuna`` and its sampler and pruner groups.

The keys are those of hydra-optuna-sweeper (``sampler``, ``direction``, ``storage``,
``study_name``, ``n_trials``, ``n_jobs``, ``max_failure_rate``, ``params``, ``search_space``,
``custom_search_space``), so its configs run unchanged; ``pruner``, ``report_every``,
``objectives``, ``batch_size``, ``keep_resume``, ``enqueue_defaults`` and the heartbeat keys
are rlspeed's additions. With ``enqueue_defaults`` (true by default) the first trial of a new
study is the run's own composed config for every searched key (``_defaults``), so a search
starts from what the defaults score. Samplers and pruners are Hydra group options
(``hydra/sweeper/sampler``, ``hydra/sweeper/pruner``) holding the Optuna class and its
constructor arguments.

This module is imported by Hydra's plugin scan on every start: it must stay light (no Optuna),
and without `from __future__ import annotations` (the scan runs it outside sys.modules,
where dataclasses cannot resolve string annotations).
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

SWEEPER_TARGET = "hydra_plugins.rlspeed_optuna_sweeper.optuna_sweeper.OptunaSweeper"


# Samplers -------------------------------------------------------------------------------
# Arguments Optuna has deprecated default to None, so they are passed only when a config
# sets them (Optuna then warns, as it should). ``seed`` is 0, so the same command samples the
# same trials (each trial seeded from it and its number, so that a resumed study samples new
# ones: _seeding); null: other trials on every run.


@dataclass
class TPESamplerConfig:
    """Tree-structured Parzen Estimator (Bayesian optimisation)."""

    _target_: str = "optuna.samplers.TPESampler"
    seed: int | None = 0
    consider_prior: bool | None = None
    prior_weight: float | None = None
    consider_magic_clip: bool | None = None
    consider_endpoints: bool | None = None
    n_startup_trials: int = 10
    n_ei_candidates: int = 24
    multivariate: bool | None = None
    group: bool = False
    warn_independent_sampling: bool | None = None
    constant_liar: bool = True


@dataclass
class RandomSamplerConfig:
    _target_: str = "optuna.samplers.RandomSampler"
    seed: int | None = 0


@dataclass
class CmaEsSamplerConfig:
    _target_: str = "optuna.samplers.CmaEsSampler"
    x0: dict[str, Any] | None = None
    sigma0: float | None = None
    n_startup_trials: int = 1
    warn_independent_sampling: bool = True
    seed: int | None = 0
    consider_pruned_trials: bool = False
    restart_strategy: str | None = None
    popsize: int | None = None
    inc_popsize: int = -1
    use_separable_cma: bool = False
    with_margin: bool = False
    lr_adapt: bool = False


@dataclass
class NSGAIISamplerConfig:
    """Multi-objective genetic algorithm."""

    _target_: str = "optuna.samplers.NSGAIISampler"
    population_size: int = 50
    mutation_prob: float | None = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5
    seed: int | None = 0


@dataclass
class GridSamplerConfig:
    """Every combination once. ``search_space`` null: the grid of ``params`` (choices and
    ranges; an interval cannot be a grid)."""

    _target_: str = "optuna.samplers.GridSampler"
    search_space: dict[str, Any] | None = None
    seed: int | None = 0


# Pruners --------------------------------------------------------------------------------
# A trial reports its score every ``eval_every`` env steps (``report_every`` sets it for all
# trials), at the env step it was measured: resources below are env steps.


@dataclass
class HyperbandPrunerConfig:
    _target_: str = "optuna.pruners.HyperbandPruner"
    # null: the sweeper's report_every (a trial's first report), else 1.
    min_resource: int | None = None
    # auto: the last step of the first trial that completes (its total_steps).
    max_resource: Any = "auto"
    reduction_factor: int = 3
    bootstrap_count: int = 0


@dataclass
class MedianPrunerConfig:
    _target_: str = "optuna.pruners.MedianPruner"
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class SuccessiveHalvingPrunerConfig:
    _target_: str = "optuna.pruners.SuccessiveHalvingPruner"
    min_resource: Any = "auto"
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0
    bootstrap_count: int = 0


@dataclass
class NopPrunerConfig:
    """No pruning: every trial trains to the end."""

    _target_: str = "optuna.pruners.NopPruner"


# The sweeper ------------------------------------------------------------------------------


@dataclass
class OptunaSweeperConf:
    _target_: str = SWEEPER_TARGET
    # The sweeper builds the sampler and pruner itself (a grid sampler needs ``params``).
    _recursive_: bool = False
    defaults: list[Any] = field(
        default_factory=lambda: [{"sampler": "tpe"}, {"pruner": "none"}, "_self_"]
    )

    sampler: Any = MISSING
    pruner: Any = MISSING
    # maximize or minimize; a list of them for a multi-objective study.
    direction: Any = "maximize"
    # Names of the numbers in each trial's metrics.json the study optimizes, one per
    # direction, e.g. [score, wall_time_s]; null: the job's return value (rlspeed's score).
    objectives: list[str] | None = None
    # Optuna storage: a journal file (path ending in .journal, or journal:PATH) or a database
    # URL. null: outputs/optuna/<study_name>.journal under the working directory, so running
    # the same command again resumes the study.
    storage: str | None = None
    # null: the selected hparams option's name, else <algo>_<task>.
    study_name: str | None = None
    # Finished trials (complete, pruned or failed) the study should have; a resumed study
    # runs only the rest.
    n_trials: int = 20
    # Trials asked for and launched together (run in parallel with hydra/launcher=joblib);
    # null: as many as the launcher runs at once (joblib: its n_jobs; otherwise 1).
    n_jobs: int | None = None
    # On the fused path (backend=flax env=jax-vmap), trials asked for at once and trained as
    # one program, vmapped over trials x seeds, in this process; trials that differ in a
    # parameter that is not traced (a shape: hidden sizes, num_steps, ...) make programs of
    # their own. 1: one trial per program. Other paths run these trials one at a time.
    batch_size: int = 1
    # Failed trials allowed, as a fraction of the trials this sweep ran, before it stops.
    max_failure_rate: float = 0.0
    # key -> Hydra override sweep syntax: interval(a, b), tag(log, interval(a, b)),
    # range(a, b, step=s), choice(x, y), x,y,z; a plain value fixes the key for every trial.
    params: dict[str, str] | None = None
    # Legacy (Hydra 1.1) form: key -> {type: float|int|categorical, low, high, step, log,
    # choices}.
    search_space: dict[str, Any] | None = None
    # Dotted path of a function (cfg, trial) -> None that suggests more parameters.
    custom_search_space: str | None = None
    # Env steps between reports of a trial's score to the pruner (sets eval_every).
    report_every: int | None = None
    # Seconds between the heartbeats this sweeper records for the trials its jobs run, and
    # how long a trial of a sweep on another machine may go without one before any sweep of
    # the study marks it FAIL (its sweep was killed). A database records the heartbeats
    # (Optuna's RDBStorage heartbeats), a journal file a trial attribute.
    heartbeat_s: int = 30
    grace_s: int = 300
    # Whether a trial that finished keeps its resume state (the replay buffer, tens of MB on
    # Doors): only an interrupted trial can continue from it, so by default it goes.
    keep_resume: bool = False
    # A new study's first trial is the run's own composed config (the defaults, with the
    # command line's plain overrides) for every searched key whose distribution holds it
    # (the sweep's log names the others, which the sampler chooses); a resumed study gets
    # no such trial. false: every trial is the sampler's.
    enqueue_defaults: bool = True


def register() -> None:
    store = ConfigStore.instance()
    store.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="rlspeed")
    samplers = {
        "tpe": TPESamplerConfig,
        "random": RandomSamplerConfig,
        "cmaes": CmaEsSamplerConfig,
        "nsgaii": NSGAIISamplerConfig,
        "grid": GridSamplerConfig,
    }
    for name, node in samplers.items():
        store.store(group="hydra/sweeper/sampler", name=name, node=node, provider="rlspeed")
    pruners = {
        "hyperband": HyperbandPrunerConfig,
        "median": MedianPrunerConfig,
        "successive_halving": SuccessiveHalvingPrunerConfig,
        "none": NopPrunerConfig,
    }
    for name, node in pruners.items():
        store.store(group="hydra/sweeper/pruner", name=name, node=node, provider="rlspeed")


register()
