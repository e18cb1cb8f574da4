"""Check the command line before Hydra starts any job.

Hydra reports composition errors over several lines; users of a CLI (and scripts on a
cluster) want one line naming the key, the bad value and what is allowed, and exit code 2
before anything runs or is created (no output folder, no MLflow run, no study). For a
multirun every swept value is checked (every value of ``a,b`` and ``range()``; for the
Optuna sweeper both ends of every range and every choice), so a bad value fails the sweep
before its first job rather than as a failed trial.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep
from hydra.errors import (
    CompactHydraException,
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
)
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from hydra_plugins.rlspeed_optuna_sweeper.config import SWEEPER_TARGET
from rlspeed.config_tree import check_creatable
from rlspeed.errors import ConfigError, RLSpeedError
from rlspeed.gym_ids import with_tuned_defaults
from rlspeed.sweep import MAX_NAME_CHARS, overlong_name
from rlspeed.validation import CheckedRun, check

EXIT_BAD_INPUT = 2


# A basic sweep (a,b and range()) launches every combination of its values: more jobs than
# this is a runaway range or a typo.
MAX_SWEEP_JOBS = 10_000
# Where the Optuna sweeper keeps the search space (hparams options fill it).
SEARCH_SPACE = "hydra.sweeper.params"
# A range of up to this many values has each checked (~10 ms each), a longer one its ends.
CHECKED_RANGE_VALUES = 100
# Settings Hydra makes a file or folder of in each job's folder: .hydra/ and <job name>.log.
NAMED_BY_HYDRA = ("hydra.output_subdir", "hydra.job.name")
# Characters of a list or dict value on the command line: far more than any list of sizes;
# Hydra's parser takes 0.6 s for 6,000 and hours for 600,000 (a 100,000-entry list).
MAX_LIST_CHARS = 4096
# Dicts whose keys are the user's (task=gym's keyword arguments for gym.make, task=gymnax's
# env params): Hydra adds a key to one with +, as to any dict of a config.
OPEN_DICTS = ("task.kwargs", "task.params")


class OneLine(CompactHydraException):
    """An rlspeed error where Hydra prints it (a multirun job's, with Hydra's own sweeper):
    its message alone, one line."""


def _open_dict(key: str) -> str | None:
    """The open dict ``key`` is in, if any."""
    return next((parent for parent in OPEN_DICTS if key.startswith(f"{parent}.")), None)


def _parse(overrides: list[str]) -> list[Override]:
    parser = OverridesParser.create()
    parsed = []
    for line in overrides:
        key, _, value = line.partition("=")
        if len(value) > MAX_LIST_CHARS and ("[" in value or "{" in value):
            # Hydra's parser takes quadratic time in a list or dict (a plain value, linear).
            allowed = f"a list or dict of at most {MAX_LIST_CHARS:,} characters"
            raise ConfigError(key, value, allowed)
        try:
            override = parser.parse_override(line)
        except HydraException as error:
            reason = str(error).split(" See https://")[0].strip()
            raise RLSpeedError(
                f"rlspeed: invalid override '{line}': {reason} "
                "(see https://hydra.cc/docs/advanced/override_grammar/basic/)"
            ) from None
        if not override.key_or_group:
            raise RLSpeedError(f"rlspeed: invalid override '{line}': expected KEY=VALUE")
        if len(override.key_or_group) > MAX_NAME_CHARS:
            # Hydra looks a key up as a config group, a folder named after it.
            raise ConfigError(
                "override key", override.key_or_group, f"at most {MAX_NAME_CHARS} characters"
            )
        parsed.append(override)
    return parsed


def _line(override: Override) -> str:
    """The override as given (the parser keeps every override's input line)."""
    assert override.input_line is not None
    return override.input_line


def _group_options(group: str) -> list[str]:
    """The options of config group ``group`` ([] where it is a key, not a group)."""
    if "." in group:  # a key: groups are folders, named with /
        return []
    loader = GlobalHydra.instance().config_loader()
    # Its repository answers at once; the loader's own get_group_options copies the whole
    # ConfigStore first (20 ms an override) to answer the same.
    assert isinstance(loader, ConfigLoaderImpl)
    return loader.repository.get_group_options(group)


def _check_overrides(parsed: list[Override]) -> None:
    """What Hydra takes silently or with a traceback: ``+key=value`` adding a key rlspeed
    never reads (a typo such as ``+algo.lerning_rate=0.1`` would be ignored), ``~key``
    removing a key or group every run needs, and a config group given something other than
    an option's name (``algo=null``, ``task=5``)."""
    for override in parsed:
        line = override.input_line
        options = _group_options(override.key_or_group)
        if override.is_add() and not options and not _open_dict(override.key_or_group):
            raise RLSpeedError(
                f"rlspeed: unknown key '{override.key_or_group}' in '{line}': rlspeed reads no "
                "such key; expected an existing key, without + (see rlspeed --cfg job)"
            )
        if override.is_delete():
            raise RLSpeedError(
                f"rlspeed: invalid override '{line}': rlspeed's keys and config groups cannot "
                f"be removed; expected {override.key_or_group}=VALUE, or no override of it"
            )
        if override.is_sweep_override():
            continue
        if options and not isinstance(override.value(), str):
            raise ConfigError(
                override.key_or_group,
                override.get_value_element_as_str(),
                f"one of {', '.join(sorted(options))}",
            )


def _check_forced_keys(parsed: list[Override], compose_job: Callable, variant: list[str]) -> None:
    """``++key=value`` sets a key, adding it where it is missing: rlspeed reads only its own
    keys, so an added one (a typo such as ``++algo.lerning_rate=0.1``) would be ignored. So
    would ``+`` adding to an open dict the config does not have (task.kwargs off task=gym)."""
    # (override, the key the config must have without the additions)
    needs = [
        (o, o.key_or_group)
        for o in parsed
        if o.is_force_add() and not _group_options(o.key_or_group)
    ]
    needs += [(o, parent) for o in parsed if o.is_add() and (parent := _open_dict(o.key_or_group))]
    if not needs:
        return

    def addition(line: str) -> bool:
        return line.startswith("++") or bool(_open_dict(line.lstrip("+").partition("=")[0]))

    base = compose_job([line for line in variant if not addition(line)])
    absent = object()
    for override, key in needs:
        if OmegaConf.select(base, key, default=absent) is absent:
            raise RLSpeedError(
                f"rlspeed: unknown key '{override.key_or_group}' in '{override.input_line}': "
                "rlspeed reads no such key; expected an existing key (see rlspeed --cfg job)"
            )


# The submitit launchers' counts and their least values (null: SLURM's default): past them
# submitit fails as the first job is submitted or collected, with a traceback.
SUBMITIT_MINIMUMS = {
    "timeout_min": 1,
    "nodes": 1,
    "tasks_per_node": 1,
    "cpus_per_task": 1,
    "gpus_per_node": 0,
    "mem_gb": 1,
    "array_parallelism": 1,
    "signal_delay_s": 0,
    "max_num_timeout": 0,
}


def _check_launcher(full: DictConfig) -> None:
    """Jobs in parallel (hydra/launcher=joblib): each trains on its own cores. The
    submitit launchers' counts: within their ranges."""
    launcher = full.hydra.launcher
    n_jobs = launcher.get("n_jobs")
    cores = os.cpu_count() or 1
    if n_jobs is not None and not (1 <= n_jobs <= cores or n_jobs == -1):
        allowed = f"an integer in [1, {cores}] (this machine's cores), or -1 (one job per core)"
        raise ConfigError("hydra.launcher.n_jobs", n_jobs, allowed)
    if "submitit" not in str(launcher.get("_target_", "")):
        return
    for key, least in SUBMITIT_MINIMUMS.items():
        value = launcher.get(key)
        if value is not None and value < least:
            raise ConfigError(f"hydra.launcher.{key}", value, f"an integer >= {least}")


def _sweep_values(override: Override) -> tuple[list[str], int]:
    """The values of a discrete sweep to check, and how many it has: every choice of
    ``a,b`` and every value of a short ``range()``; a long one's first and last (composing
    each of its values would take minutes), counted without listing them
    (``range(0, 10**10)`` would take all memory)."""
    sweep = override.value()
    if not isinstance(sweep, RangeSweep):
        values = list(override.sweep_string_iterator())
        return values, len(values)
    start, stop, step = sweep.start, sweep.stop, sweep.step
    assert start is not None and stop is not None  # a parsed range() has both
    if isinstance(start, int) and isinstance(stop, int) and isinstance(step, int) and step:
        count = len(range(start, stop, step))
    else:
        count = max(0, math.ceil((stop - start) / step)) if step else 0
    if count <= CHECKED_RANGE_VALUES:
        return list(override.sweep_string_iterator()), count
    return [str(start), str(start + step * (count - 1))], count


def _variants(parsed: list[Override]) -> tuple[list[list[str]], int]:
    """Override lists that together try every value of the discrete sweeps (``a,b``,
    ``range()``: see _sweep_values) at least once, one key at a time; and the number of
    jobs Hydra's basic sweeper makes of them (every combination)."""
    choices: list[list[str]] = []
    jobs = 1
    for override in parsed:
        if not override.is_sweep_override():
            choices.append([_line(override)])
            continue
        try:
            values, count = _sweep_values(override)
        except Exception:  # interval(): only the Optuna sweeper samples it (see _check_sweep)
            continue
        if not values:
            raise RLSpeedError(
                f"rlspeed: invalid override '{override.input_line}': the sweep has no values; "
                "expected a non-empty sweep (range(start, stop) stops before stop)"
            )
        key = override.get_key_element()
        choices.append([f"{key}={value}" for value in values])
        jobs *= count
    base = [options[0] for options in choices]
    variants = [base]
    for i, options in enumerate(choices):
        for option in options[1:]:
            variants.append(base[:i] + [option] + base[i + 1 :])
    return variants, jobs


def _check_mode(full: DictConfig, parsed: list[Override], multirun: bool) -> None:
    """Sweeps and searches need -m; a basic sweep cannot sample an interval()."""
    optuna = full.hydra.sweeper.get("_target_") == SWEEPER_TARGET
    if not multirun:
        hparams = full.hydra.runtime.choices.get("hparams")
        if optuna:
            key, value = ("hparams", hparams) if hparams else ("hydra/sweeper", "optuna")
            raise RLSpeedError(
                f"rlspeed: invalid {key}={value} without -m: a search runs its trials as a "
                f"multirun; expected rlspeed -m {key}={value} ..."
            )
        for override in parsed:
            if override.is_sweep_override():
                raise RLSpeedError(
                    f"rlspeed: invalid {override.input_line} without -m: a sweep runs one job "
                    f"per value; expected rlspeed -m {override.input_line} ..."
                )
    elif not optuna:
        for override in parsed:
            if isinstance(override.value(), IntervalSweep):
                raise RLSpeedError(
                    f"rlspeed: invalid {override.input_line}: Hydra's basic sweeper cannot "
                    "sample an interval; expected a,b,c or range(), or the Optuna sweeper "
                    "(hydra/sweeper=optuna, or an hparams=<search>)"
                )


def _check_output_dir(full: DictConfig, multirun: bool) -> None:
    """Hydra creates the run's (or the sweep's) folder; check it can, creating nothing."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    folder = OmegaConf.select(full, key)
    allowed = "a folder rlspeed can create and write to"
    if not folder:  # Hydra would write the run's files into the working directory
        raise ConfigError(key, folder, allowed)
    subdir = ["hydra.sweep.subdir"] if multirun else []
    for named in [key, *subdir, *NAMED_BY_HYDRA]:
        value = _setting(full, named)
        if value is not None and (name := overlong_name(value)) is not None:
            allowed_names = f"file and folder names of at most {MAX_NAME_CHARS} characters"
            raise ConfigError(named, value, f"{allowed_names} (one has {len(name):,})")
    check_creatable(key, folder, Path(folder), allowed)


def _setting(full: DictConfig, key: str) -> str | None:
    """A setting's value; its text where it cannot be resolved before its job (such as
    hydra.sweep.subdir's ${hydra.job.num})."""
    value = OmegaConf.select(full, key, throw_on_resolution_failure=False)
    if value is None:
        parent, _, leaf = key.rpartition(".")
        raw = OmegaConf.to_container(OmegaConf.select(full, parent), resolve=False)
        value = raw.get(leaf) if isinstance(raw, dict) else None
    return None if value is None else str(value)


def _explain(error: Exception) -> str:
    """One line for a Hydra/OmegaConf composition error."""
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, value = error.missing_cfg_file.rpartition("/")
        if not group:
            return f"rlspeed: invalid --config-name={value}: expected a config in the config path"
        allowed = ", ".join(sorted(error.options or [])) or "an existing option"
        return f"rlspeed: invalid {group}={value}: expected one of {allowed}"
    cause = error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "?"
        message = str(cause.msg if hasattr(cause, "msg") else cause).splitlines()[0]
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) or "not in struct" in message:
            if _open_dict(key):
                return f"rlspeed: unknown key '{key}': a new key is added with +, e.g. +{key}=VALUE"
            return f"rlspeed: unknown key '{key}': it is not in the config (see rlspeed --cfg job)"
        return f"rlspeed: invalid {key}: {message}"
    return "rlspeed: " + " ".join(str(error).split())


def _is_hydra(override: str) -> bool:
    return override.lstrip("+~").startswith("hydra")


def _check_sweep(full: DictConfig, arguments: list[str], compose_job: Callable) -> None:
    """The Optuna sweeper's settings (search space, keys, direction, sampler, pruner,
    storage), then the job config at both ends of every range and at every choice, so a
    value outside a key's allowed range fails now rather than as a FAIL trial."""
    from hydra_plugins.rlspeed_optuna_sweeper._space import build
    from hydra_plugins.rlspeed_optuna_sweeper._sweep import sweep_storage

    setup = build(full.hydra.sweeper, full, arguments)
    sweep_storage(full)  # raises if trials cannot be recorded in hydra.sweeper.storage
    for overrides in setup.space.extremes():
        check(compose_job(overrides))


def preflight(argv: list[str], conf_dir: str) -> tuple[CheckedRun | None, bool]:
    """Exit with one clear line and code 2 if the command line cannot run. Returns its
    first job's check (None where it has none: --help, --info) and whether the command
    only prints that job's config (``--cfg job``, no ``--package``)."""
    parser = get_args_parser()
    parser.exit_on_error = False  # argparse's usage block would come before its line
    try:
        args, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as error:
        _fail(f"rlspeed: invalid command line: {error} (see rlspeed --help)")
    if options := [x for x in unknown if x.startswith("-")]:
        _fail(f"rlspeed: invalid command line: unknown option {options[0]} (see rlspeed --help)")
    if args.help or args.hydra_help:
        return None, False
    showing = args.cfg is not None  # --cfg prints the config: no job, no folder, no -m
    commands = (args.run, args.multirun, showing, args.info is not None, args.shell_completion)
    if sum(map(bool, commands)) > 1:
        _fail(
            "rlspeed: invalid command line: expected at most one of --run, --multirun (-m), "
            "--cfg, --info and --shell-completion"
        )
    if args.info or args.shell_completion:
        return None, False
    overrides = [o for o in args.overrides if not _is_hydra(o)]
    hydra_overrides = [o for o in args.overrides if _is_hydra(o)]
    if args.config_dir and not os.path.isdir(args.config_dir):
        _fail(f"rlspeed: invalid --config-dir={args.config_dir}: expected an existing folder")
    if args.config_dir and not any(o.startswith("hydra.searchpath") for o in hydra_overrides):
        # --config-dir adds a config folder (e.g. one's own hparams options).
        path = "file://" + os.path.abspath(args.config_dir)
        hydra_overrides.append(f"hydra.searchpath=['{path}']")
    try:
        first = check_overrides(
            overrides,
            hydra_overrides,
            conf_dir,
            config_name=args.config_name or "config",
            multirun=args.multirun,
            showing=showing,
        )
    except RLSpeedError as error:
        _fail(str(error))
    return first, args.cfg == "job" and not args.package


def check_overrides(
    overrides: list[str],
    hydra_overrides: list[str],
    conf_dir: str,
    config_name: str = "config",
    multirun: bool = False,
    showing: bool = False,
) -> CheckedRun:
    """Raise RLSpeedError with one line naming key, value and what is allowed if the run
    (or every job of the sweep) these overrides describe cannot run; else return the first
    job's check. ``showing``: the config is only printed (--cfg), so no job runs and no
    folder is made."""
    searchpath = [o for o in hydra_overrides if o.startswith("hydra.searchpath")]
    try:
        parsed = _parse(overrides)
        for override in _parse(hydra_overrides):
            if override.is_sweep_override() and override.key_or_group.startswith(SEARCH_SPACE):
                key = override.key_or_group.removeprefix(SEARCH_SPACE + ".")
                space = _line(override).split("=", 1)[1]
                raise RLSpeedError(
                    f"rlspeed: invalid override '{override.input_line}': a search goes on the "
                    f"key it searches, expected {key}={space} with -m"
                )
        with initialize_config_dir(config_dir=conf_dir, version_base=None):
            _check_overrides(parsed)
            variants, jobs = _variants(parsed)

            def compose_plain(job_overrides: list[str]) -> DictConfig:
                return compose(config_name=config_name, overrides=[*job_overrides, *searchpath])

            def compose_job(job_overrides: list[str]) -> DictConfig:
                plain = compose_plain(job_overrides)
                return with_tuned_defaults(plain, job_overrides, compose_plain)

            # Hydra's own groups and settings (sweeper, sampler, pruner, launcher, folders).
            full = compose(
                config_name=config_name,
                overrides=[*variants[0], *hydra_overrides],
                return_hydra_config=True,
            )
            multirun = multirun or full.hydra.mode == RunMode.MULTIRUN
            if not showing:
                _check_mode(full, parsed, multirun)
            _check_forced_keys(parsed, compose_job, variants[0])
            optuna = full.hydra.sweeper.get("_target_") == SWEEPER_TARGET
            if multirun and not optuna and jobs > MAX_SWEEP_JOBS:
                sweeps = " ".join(_line(o) for o in parsed if o.is_sweep_override())
                raise RLSpeedError(
                    f"rlspeed: invalid sweep {sweeps}: it makes {jobs:,} jobs, expected at "
                    f"most {MAX_SWEEP_JOBS:,} (Hydra lists every job before the first starts)"
                )
            if multirun:
                _check_launcher(full)
            first = check(with_tuned_defaults(_job_part(full), variants[0], compose_plain))
            for variant in variants[1:]:
                check(compose_job(variant))
            if not showing:
                if optuna:
                    _check_sweep(full, overrides, compose_job)
                _check_output_dir(full, multirun)
            return first
    except RLSpeedError:
        raise  # a HydraException too: already one line
    except (ConfigCompositionException, OmegaConfBaseException) as error:
        raise RLSpeedError(_explain(error)) from None
    except HydraException as error:
        raise RLSpeedError("rlspeed: " + " ".join(str(error).split())) from None


def _job_part(full: DictConfig) -> DictConfig:
    """What ``compose`` returns without the hydra node for the same job overrides, taken
    from ``full`` rather than composed again (a fifth of a second): Hydra composes both
    alike and then drops the node, and the hydra overrides ``full`` had besides set keys
    under it only."""
    job = copy.deepcopy(full)
    with open_dict(job):
        del job["hydra"]
    return job


def _fail(line: str) -> None:
    print(line, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)
