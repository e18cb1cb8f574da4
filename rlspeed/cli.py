"""The ``rlspeed`` command: a thin Hydra entrypoint with a pre-flight config check.

Importing this module loads nothing heavy: ``main`` turns a Ctrl-C that comes while
Hydra, the config schema and the backends load into its one line too."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlspeed.validation import CheckedRun


def _conf_dir() -> str:
    packaged = Path(__file__).parent / "conf"  # installed wheel: rlspeed/conf
    if packaged.is_dir():
        return str(packaged)
    return str(Path(__file__).resolve().parents[1] / "conf")  # source checkout: ./conf


CONF_DIR = _conf_dir()


# Set when a single run (not a multirun's job) has finished: the process then ends at once.
_finished: list[bool] = []


def _task(cfg: DictConfig, first: CheckedRun | None) -> float:
    """One Hydra job: the run ``cfg`` describes (``first``: the command line's check of its
    first job, which a single run's job is)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rlspeed import secrets
    from rlspeed.errors import RLSpeedError
    from rlspeed.machine import choose_mujoco_gl
    from rlspeed.preflight import OneLine
    from rlspeed.run import run
    from rlspeed.sweep import exit_if_sweep_gone, stop_with_sweep

    secrets.install()  # a job in a process of its own (hydra/launcher=joblib, submitit)
    choose_mujoco_gl()  # likewise: before the job's task imports mujoco
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        stop_with_sweep()
    try:
        single = HydraConfig.get().mode == RunMode.RUN
        score = run(cfg, first.of(cfg) if first is not None and single else None)
        if single:
            _finished.append(True)
        return score
    except RLSpeedError as error:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # The sweeper records the job as failed and goes on; where Hydra's own sweeper
            # ends the command with it, Hydra prints it as one line.
            raise OneLine(str(error)) from None
        # One line, not Hydra's three ("Error executing job with overrides: ...").
        print(error, file=sys.stderr)
        sys.exit(1)
    finally:
        exit_if_sweep_gone()


# Config groups that are rlspeed's own plumbing, not choices for users: the typed schemas
# (schema/*) and the per-pair defaults chosen for them (algo_task).
_INTERNAL_GROUPS = ("algo_task", "schema")


def _config_groups() -> str:
    """``rlspeed --help``'s list of config groups (``group: option, ...``), without Hydra's
    and rlspeed's internal groups: the ``${rlspeed_config_groups:}`` of conf/hydra/help."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    lines = []
    for group in sorted(loader.list_groups("")):
        if group == "hydra" or group.split("/")[0] in _INTERNAL_GROUPS:
            continue
        lines.append(f"  {group}: {', '.join(sorted(loader.get_group_options(group)))}")
    return "\n".join(lines)


def _stack(_root_: DictConfig) -> str:
    """``<backend>_<env>_<algo>_<task>`` of the run (the task with its env's id, where it
    has one: ``task_label``), for its folder's name (the
    ``${rlspeed_stack:}`` of ``hydra.run.dir``); with ``mode=eval``, ``eval_`` and those of
    the run that saved the checkpoint, which is what is evaluated (its config.yaml is read
    and checked by then: rlspeed.validation.check_modes)."""
    cfg, prefix = _root_, ""
    if cfg.mode == "eval":
        from rlspeed.checkpoint import agent_files
        from rlspeed.saved_config import read_config

        folder = agent_files(cfg.checkpoint)[0].parent
        cfg, prefix = read_config("checkpoint", cfg.checkpoint, folder), "eval_"
    from rlspeed.config import task_label

    groups = [str(cfg[group].name) for group in ("backend", "env", "algo")]
    return prefix + "_".join([*groups, task_label(cfg.task)])


def _task_label(_root_: DictConfig) -> str:
    """The task of a sweep's job, with its env's id where it has one (``task_label``), for
    its folder's name (``${rlspeed_task:}`` of ``hydra.sweep.subdir``)."""
    from rlspeed.config import task_label

    return task_label(_root_.task)


def _log_every(every: int, _root_: DictConfig) -> int:
    """``${rlspeed_log_every:N}`` as ``default_log_every``, but a run continued with
    ``resume=`` (perhaps to a larger total_steps) keeps the interval it ran with."""
    from rlspeed.config_tree import default_log_every

    if _root_.get("resume") is not None:
        from rlspeed.checkpoint import run_folder
        from rlspeed.errors import ConfigError
        from rlspeed.saved_config import read_config

        try:
            saved = read_config("resume", _root_.resume, run_folder(_root_.resume))
            return int(saved.log_every)
        except (ConfigError, OSError, TypeError, ValueError):
            pass  # the resume check says what is wrong with the folder
    return default_log_every(every, _root_.total_steps)


def _version() -> str:
    from importlib.metadata import version

    return f"rlspeed {version('rlspeed')}"


def set_up_config_tree(showing_help: bool = False) -> None:
    """The schemas and resolvers rlspeed's config tree composes with."""
    from omegaconf import OmegaConf

    from rlspeed.config_tree import register_configs

    register_configs()
    # Hydra resolves the help text at every compose; listing the groups scans the whole
    # config tree (a quarter of a rejected command's time), so only --help lists them.
    groups = _config_groups if showing_help else str
    OmegaConf.register_new_resolver("rlspeed_config_groups", groups, replace=True)
    OmegaConf.register_new_resolver("rlspeed_stack", _stack, replace=True)
    OmegaConf.register_new_resolver("rlspeed_task", _task_label, replace=True)
    OmegaConf.register_new_resolver("rlspeed_log_every", _log_every, replace=True)


# Keys the sweeper and the tracker set for a job, never a user: ``--cfg job`` leaves them out.
INTERNAL_KEYS = ("trial", "tracking.parent_run_id")


def check_command_line(argv: list[str]) -> CheckedRun | None:
    """What the command does before Hydra starts: set up the config tree, then exit with
    code 2 and one line naming key, value and what is allowed if ``argv`` cannot run.
    ``--cfg job`` prints the job's config here, without rlspeed's internal keys. Returns
    the check of the command's first job (the run of a single-run command)."""
    from omegaconf import OmegaConf

    from rlspeed.preflight import preflight
    from rlspeed.secrets import mask

    set_up_config_tree(showing_help=not {"--help", "-h"}.isdisjoint(argv))
    first, printing = preflight(argv, CONF_DIR)
    if printing and first is not None:
        shown = OmegaConf.to_container(first.composed, resolve="--resolve" in argv)
        assert isinstance(shown, dict)
        for key in INTERNAL_KEYS:
            parent, _, name = key.rpartition(".")
            (shown[parent] if parent else shown).pop(name)
        print(mask(OmegaConf.to_yaml(shown)), end="")
        sys.exit(0)
    return first


def main() -> None:
    if "--version" in sys.argv[1:]:  # before Hydra and the backends load: it stays instant
        print(_version())
        sys.exit(0)
    try:
        from rlspeed import secrets
        from rlspeed.errors import interrupt
        from rlspeed.machine import choose_mujoco_gl

        # MuJoCo draws without a display through EGL or OSMesa, chosen before it is imported.
        choose_mujoco_gl()

        # Hydra prints the command line's overrides (--cfg, a failed job's line) and logs
        # them (a sweep's jobs): passwords in URLs are masked in all that.
        secrets.install()
        # Nor do the configs Hydra writes and pickles hold them: Hydra never sees them.
        sys.argv[1:] = secrets.hide_in_arguments(sys.argv[1:])

        # Ctrl-C and SIGTERM stop the command wherever they land with one line (a signal the
        # caller ignores, as a shell does SIGINT for a background job, stays ignored).
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, interrupt)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, interrupt)
        import hydra

        first = check_command_line(sys.argv[1:])

        def job(cfg: DictConfig) -> float:
            return _task(cfg, first)

        hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")(job)()
        if _finished:
            _exit_at_once()
    except KeyboardInterrupt as stop:
        # rlspeed.errors.Interrupted, or the plain KeyboardInterrupt of a Ctrl-C that came early.
        signum = getattr(stop, "signum", signal.SIGINT)
        out_dir = getattr(stop, "out_dir", None)
        line = f"rlspeed: interrupted by {signal.Signals(signum).name}"
        if out_dir is not None:
            from rlspeed.checkpoint import resume_files  # loaded already by the run

            line += f"; the run ends as KILLED, what it recorded is in {out_dir}"
            if getattr(stop, "requeued", False):
                line += "; its SLURM job is requeued and will continue it"
            elif resume_files(out_dir):
                line += f" (continue it with resume={out_dir})"
        print(line, file=sys.stderr)
        sys.exit(128 + signum)


def _exit_at_once() -> None:
    """End a finished run's process without tearing down its modules: every output is
    written and closed, the tracking writer has answered, and unloading JAX, torch and the
    rest took 0.5-1 s of a short run's wall time. The log file and the console are flushed
    first; nothing else in the process has work left."""
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
