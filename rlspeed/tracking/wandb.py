"""``tracking=wandb``: each run in Weights & Biases (``pip install "rlspeed[wandb]"``).

A run is a W&B run in project ``tracking.project`` (null: ``WANDB_PROJECT``, else rlspeed)
of ``tracking.entity`` (null: W&B's default), online, offline or disabled as
``tracking.mode`` says (null: W&B's choice, ``WANDB_MODE`` or online); its files go to
``<tracking.dir>/wandb/`` (null: ``WANDB_DIR``, else the run's output folder), so an offline
run is kept beside its results for ``wandb sync``. What maps to what:

- the run's name (``flax-jax-vmap-dqn-doors``) is the W&B run's name; its config, nested as
  in ``config.yaml``, is the W&B config (values as they are: numbers stay numbers);
- what ran (``backend``, ``env``, ``algo``, ``task``, ``env_id``, ``optuna.*``) are W&B tags
  ``key=value``, after ``tracking.tags``; what it ran on (``rlspeed.version``,
  ``rlspeed.command``, ...: rlspeed's other tags) is in the config under ``rlspeed``;
- each metrics row (CleanRL's names: ``charts/episodic_return``, ``losses/...``,
  ``eval/score``) is one ``log`` of its values and ``global_step``, the env step, which is
  every chart's x-axis (``define_metric``): the seeds of a host-driven run log their steps
  one seed after another, which W&B's own step, always rising, would drop;
- the run's files (the agent's checkpoint, ``config.yaml``, ``metrics.json``,
  ``learning_curve.png``) are one artifact of type ``model``, ``model-<run id>``, as they
  were when the run ended;
- how it ended is its exit code (FINISHED 0, FAILED 1, KILLED 130, as Ctrl-C's) and the
  summary's ``status``;
- a requeued SLURM job continues the W&B run of its earlier attempt (``id=``,
  ``resume="allow"``); ``resume=`` starts a new run (as in MLflow: its rows go on from the
  saved step, which may lie before the old run's last).

Written by the tracking writer process, as MLflow is (``rlspeed.tracking._writer``): a W&B
that cannot be reached, or is not logged in, costs training nothing; the run says so in one
line, and everything it recorded is in its folder.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlspeed import secrets
from rlspeed.config_tree import check_creatable
from rlspeed.errors import ConfigError
from rlspeed.tracking import TrackerSpec, artifact_folder, cause
from rlspeed.tracking._store_writer import Row
from rlspeed.tracking._writer import WriterProcess

if TYPE_CHECKING:
    from types import SimpleNamespace

    from omegaconf import DictConfig

INSTALL = 'pip install "rlspeed[wandb]"'
DEFAULT_PROJECT = "rlspeed"
MODES = ("online", "offline", "disabled")
# What W&B takes in WANDB_MODE (wandb.Settings.mode): its own synonyms too.
ENV_MODES = (*MODES, "dryrun", "run", "shared")
# W&B's limits on a project's (and an entity's) name, a group's and a tag's.
MAX_NAME = 128
NAME_FORBIDS = "/\\#?%:"
MAX_TAG = 64
# The exit code each way of ending gives the W&B run: 0 is finished; any other, failed.
EXIT_CODES = {"FINISHED": 0, "FAILED": 1, "KILLED": 130}
# W&B's own waits, where the user has not set them (WANDB_INIT_TIMEOUT, ...): W&B's defaults
# wait 90 s for a run to start and for ever for its uploads. A W&B that does not answer is
# tried while the run trains and twice more as it ends (its records, then its end): up to
# 2 x 20 s at the end of the run. What was not uploaded stays in the run's wandb/ folder,
# for `wandb sync`.
_TIMEOUTS = {"init_timeout": 20.0, "finish_timeout": 60.0}


def project(cfg: Any) -> str:
    return cfg.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT


def wandb_dir(cfg: Any, out_dir: Path) -> Path:
    """The folder W&B keeps its ``wandb/`` in (the module docstring)."""
    return Path(cfg.dir or os.environ.get("WANDB_DIR") or out_dir)


def installed() -> bool:
    try:
        return importlib.util.find_spec("wandb") is not None
    except ValueError:  # imported as None: hidden on purpose
        return False


def check(cfg: DictConfig) -> None:
    """Refuse, before anything is created, settings W&B would refuse (or rlspeed cannot use):
    wandb not installed, an unknown mode, a project, entity, group or tag W&B does not take,
    a ``dir`` that cannot be created. Whether W&B answers is not asked: a W&B that does not
    is one line at the run's end, and the run trains and keeps its results all the same."""
    if cfg.mode is not None and cfg.mode not in MODES:
        raise ConfigError("tracking.mode", cfg.mode, f"null (W&B's default), {', '.join(MODES)}")
    mode = os.environ.get("WANDB_MODE")
    if cfg.mode is None and mode and mode not in ENV_MODES:
        raise ConfigError("WANDB_MODE", mode, f"one of {', '.join(ENV_MODES)}")
    key = (
        "tracking.project" if cfg.project or "WANDB_PROJECT" not in os.environ else "WANDB_PROJECT"
    )
    _check_name(key, project(cfg), "a W&B project")
    if cfg.entity is not None:
        _check_name("tracking.entity", cfg.entity, "a W&B entity (a user or team)")
    if cfg.group is not None and not 0 < len(cfg.group) <= MAX_NAME:
        raise ConfigError("tracking.group", cfg.group, f"a group of 1 to {MAX_NAME} characters")
    for tag in cfg.tags:
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG:
            raise ConfigError("tracking.tags", tag, f"tags of 1 to {MAX_TAG} characters (W&B's)")
    if cfg.dir is not None:
        check_creatable("tracking.dir", cfg.dir, Path(cfg.dir), "a folder rlspeed can write to")
    if not installed():
        raise ConfigError("tracking", "wandb", f"an installed wandb: {INSTALL}")


def _check_name(key: str, name: str, what: str) -> None:
    if not 0 < len(name) <= MAX_NAME or any(char in NAME_FORBIDS for char in name):
        allowed = f"{what} name of 1 to {MAX_NAME} characters, none of {NAME_FORBIDS}"
        raise ConfigError(key, name, allowed)


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys (``algo.learning_rate``) as nested dicts, as ``config.yaml`` has them. A
    key whose parts would collide with another's (a dotted key inside ``task.kwargs``)
    stays dotted under the last part that does not."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node, parts = tree, key.split(".")
        while len(parts) > 1 and isinstance(node.setdefault(parts[0], {}), dict):
            node = node[parts.pop(0)]
        node[".".join(parts)] = value
    return tree


def split_tags(tags: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """rlspeed's tags as W&B's: what ran as tags ``key=value`` (those W&B's 64 characters
    hold); what it ran on (the ``rlspeed.*`` tags, keyed without ``rlspeed.``) for the
    config's ``rlspeed`` section, with what was too long for a tag."""
    labels, about = [], {}
    for key, value in tags.items():
        label = f"{key}={value}"
        if key.startswith("rlspeed.") or len(label) > MAX_TAG:
            about[key.removeprefix("rlspeed.")] = value
        else:
            labels.append(label)
    return labels, about


class WandbStore:
    """One W&B run, driven by the tracking writer process (``rlspeed.tracking._writer``):
    W&B's import and its service start there, off training's path. Every call raises on
    failure; the writer holds what failed and tries again."""

    def __init__(self, cfg: SimpleNamespace) -> None:
        # W&B's banners and "View run at" lines: rlspeed's summary gives the links.
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.errors: tuple[type[BaseException], ...] = (wandb.Error, OSError, TimeoutError)
        self._cfg = cfg
        self._run: Any = None
        self.run_id: str | None = None
        self._files: list[Path] = []
        self._out_dir = Path(cfg.out_dir)
        # The config's ``rlspeed`` section (split_tags), added to by set_tags.
        self._about: dict[str, str] = {}
        self._labels: list[str] = []

    def start(
        self, run_name: str, params: dict[str, Any], tags: dict[str, str], run_id: str | None
    ) -> None:
        import wandb

        if self._run is None:  # a start tried again after a failure: init again
            cfg = self._cfg
            labels, self._about = split_tags(tags)
            self._labels = list(dict.fromkeys([*cfg.tags, *labels]))
            # W&B records the command a run ran as its program and arguments: the training's
            # (passwords in URLs masked), not this writer's.
            command = [secrets.mask(argument) for argument in cfg.command]
            sys.argv = command
            settings: dict[str, Any] = {"console": "off", "x_stats_pid": cfg.pid}
            if command and command[0]:
                settings["program"] = command[0]
            for name, seconds in _TIMEOUTS.items():
                if f"WANDB_{name.upper()}" not in os.environ:
                    settings[name] = seconds
            if "WANDB_FINISH_TIMEOUT_RAISES" not in os.environ:
                settings["finish_timeout_raises"] = True
            group = cfg.group
            if group is None and "WANDB_RUN_GROUP" not in os.environ:
                group = tags.get("optuna.study")  # a sweep's trials, together
            Path(cfg.dir).mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                name=run_name,
                config={**nested(params), "rlspeed": self._about},
                tags=self._labels,
                group=group,
                job_type="train",
                dir=cfg.dir,
                mode=cfg.mode,
                id=run_id,
                resume="allow" if run_id is not None else None,
                settings=wandb.Settings(**settings),
            )
        self._run.define_metric("global_step")
        self._run.define_metric("*", step_metric="global_step")
        self.run_id = None if self._run.disabled else self._run.id

    def log_rows(self, rows: list[Row]) -> None:
        for row in rows:
            self._run.log({**row.metrics, "global_step": row.step})

    def log_artifact(self, path: Path) -> None:
        # One artifact of the run's files, logged as the run ends (they come together then).
        if path not in self._files:
            self._files.append(path)

    def set_tags(self, tags: dict[str, str]) -> None:
        labels, about = split_tags(tags)
        self._labels = list(dict.fromkeys([*self._labels, *labels]))
        self._run.tags = tuple(self._labels)
        if about:
            self._about.update(about)
            self._run.config.update({"rlspeed": self._about}, allow_val_change=True)

    def end(self, status: str) -> None:
        import wandb

        run = self._run
        if run is None:
            return
        if self._files and not run.disabled:
            model = wandb.Artifact(f"model-{run.id}", type="model", metadata={"status": status})
            for path in self._files:
                # Copied as they are now (W&B's staging folder, WANDB_DATA_DIR, until they are
                # uploaded): a requeued job writes the same names in the folder again.
                folder = artifact_folder(path, self._out_dir)  # videos/ as in the run folder
                model.add_file(str(path), name=f"{folder}/{path.name}" if folder else path.name)
            run.log_artifact(model, aliases=["latest", status.lower()])
            self._files = []
        run.summary["status"] = status
        run.finish(exit_code=EXIT_CODES[status])

    def links(self) -> dict[str, str]:
        run = self._run
        if run is None or run.disabled:
            return {}
        if run.offline:
            return {"W&B (offline)": f"wandb sync {shlex.quote(str(Path(run.dir).parent))}"}
        return {"W&B run": run.url}

    def lost(self, error: BaseException) -> str:
        if self._run is None:
            return f"W&B could not start the run ({_why(error)})"
        kept = Path(self._run.dir).parent
        return (
            f"W&B did not take all of the run's records ({_why(error)}); "
            f"`wandb sync {shlex.quote(str(kept))}` uploads what it kept"
        )


def _why(error: BaseException) -> str:
    """W&B's own message where it has one (its errors name the cause, e.g. "No API key
    configured. Use `wandb login` to log in.", over the exception they were raised from),
    else the OS's reason (``cause``)."""
    lines = [] if isinstance(error, OSError) else str(error).splitlines()
    return lines[0][:200] if lines else cause(error)


def preload() -> None:
    """What the tracking writers' zygote loads once for all of them (``_writer``): W&B's
    import (~1 s), which starts no thread; its service starts in each writer."""
    import wandb  # noqa: F401
    import wandb.sdk.artifacts.artifact  # noqa: F401


def make_store(cfg: SimpleNamespace) -> WandbStore:
    """The store the tracking writer process drives (``rlspeed.tracking._writer``)."""
    return WandbStore(cfg)


def make_tracker(cfg: DictConfig, out_dir: Path) -> WriterProcess:
    """The run's tracker: W&B driven by a process of its own, off training's path. The
    writer samples this process's CPU and memory (W&B's system charts) and names its command
    as the run's program."""
    settings = {
        "project": project(cfg),
        "entity": cfg.entity,
        "mode": cfg.mode,
        "dir": str(wandb_dir(cfg, out_dir).resolve()),
        "out_dir": str(out_dir.resolve()),
        "group": cfg.group,
        "tags": list(cfg.tags),
        "command": sys.argv,
        "pid": os.getpid(),
    }
    return WriterProcess(__name__, settings, typed_params=True)


SPEC = TrackerSpec(name="wandb", make=make_tracker, check=check)
