"""Check the command line before Hydra starts any job.

Hydra reports composition errors over several lines; users of a CLI (and scripts on a
cluster) want one line naming the key, the bad value and what is allowed, and a non-zero
exit code before anything runs. For a multirun every swept value is checked, so a bad
value fails the sweep before its first job rather than in the middle.
"""

from __future__ import annotations

import os
import sys

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from rlspeed.config import validate
from rlspeed.errors import RLSpeedError

EXIT_BAD_INPUT = 2


def _variants(overrides: list[str]) -> list[list[str]]:
    """Override lists that together try every swept value at least once."""
    parser = OverridesParser.create()
    parsed = []
    for line in overrides:
        try:
            parsed.append(parser.parse_override(line))
        except HydraException as error:
            reason = str(error).split(" See https://")[0].strip()
            raise RLSpeedError(
                f"rlspeed: invalid override '{line}': {reason} "
                "(see https://hydra.cc/docs/advanced/override_grammar/basic/)"
            ) from None
    choices: list[list[str]] = []
    for override in parsed:
        if override.is_sweep_override():
            try:
                values = list(override.sweep_string_iterator())
            except Exception:  # interval() and other non-discrete sweeps: the sweeper checks
                continue
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in values])
        else:
            choices.append([override.input_line])
    base = [options[0] for options in choices]
    variants = [base]
    for i, options in enumerate(choices):
        for option in options[1:]:
            variants.append(base[:i] + [option] + base[i + 1 :])
    return variants


def _explain(error: Exception) -> str:
    """One line for a Hydra/OmegaConf composition error."""
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, value = error.missing_cfg_file.rpartition("/")
        allowed = ", ".join(sorted(error.options or [])) or "an existing option"
        return f"rlspeed: invalid {group}={value}: expected one of {allowed}"
    cause = error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "?"
        message = str(cause.msg if hasattr(cause, "msg") else cause).splitlines()[0]
        if "not in struct" in message:
            return f"rlspeed: unknown key '{key}': it is not in the config (see rlspeed --cfg job)"
        return f"rlspeed: invalid {key}: {message}"
    return "rlspeed: " + " ".join(str(error).split())


def _is_hydra(override: str) -> bool:
    return override.lstrip("+~").startswith("hydra")


def _check_sweeper(cfg: DictConfig, arguments: list[str]) -> None:
    """The Optuna sweeper's settings: search space, keys, direction, sampler, pruner."""
    from hydra_plugins.rlspeed_optuna_sweeper.config import SWEEPER_TARGET

    node = cfg.hydra.sweeper
    if node.get("_target_") == SWEEPER_TARGET:
        from hydra_plugins.rlspeed_optuna_sweeper._impl import sweep_storage
        from hydra_plugins.rlspeed_optuna_sweeper._space import build

        build(node, cfg, arguments)
        sweep_storage(cfg)  # raises if trials cannot be recorded in hydra.sweeper.storage


def preflight(argv: list[str], conf_dir: str) -> None:
    """Exit with one clear line and code 2 if the command line cannot run."""
    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion:
        return
    overrides = [o for o in args.overrides if not _is_hydra(o)]
    hydra_overrides = [o for o in args.overrides if _is_hydra(o)]
    if args.config_dir and not any(o.startswith("hydra.searchpath") for o in hydra_overrides):
        # --config-dir adds a config folder (e.g. one's own hparams options).
        path = "file://" + os.path.abspath(args.config_dir)
        hydra_overrides.append(f"hydra.searchpath=['{path}']")
    searchpath = [o for o in hydra_overrides if o.startswith("hydra.searchpath")]
    config_name = args.config_name or "config"
    try:
        variants = _variants(overrides)
        with initialize_config_dir(config_dir=conf_dir, version_base=None):
            for variant in variants:
                validate(compose(config_name=config_name, overrides=[*variant, *searchpath]))
            # Hydra's own groups and settings (sweeper, sampler, pruner, launcher).
            full = compose(
                config_name=config_name,
                overrides=[*variants[0], *hydra_overrides],
                return_hydra_config=True,
            )
            if args.multirun or full.hydra.mode == RunMode.MULTIRUN:
                _check_sweeper(full, overrides)
    except RLSpeedError as error:
        _fail(str(error))
    except (ConfigCompositionException, OmegaConfBaseException) as error:
        _fail(_explain(error))
    except HydraException as error:
        _fail("rlspeed: " + " ".join(str(error).split()))


def _fail(line: str) -> None:
    print(line, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)
