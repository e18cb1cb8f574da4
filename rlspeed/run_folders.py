"""The run folders a config names, checked against it before any work starts: ``resume=``
(a run of this config whose resume files are whole), ``init_from=`` (an agent this run's
networks can take) and ``checkpoint=`` / ``video=`` of ``mode=eval`` (agent files and a
config.yaml that read back). Each refusal is one ConfigError line; the files themselves are
read by ``rlspeed.checkpoint`` and ``rlspeed.evaluate``, once: what the check reads goes to
the run.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlspeed.checkpoint import (
    CONFIG_FILE,
    PICKLED_RESUME_FILES,
    RESUME_FILE,
    agent_files,
    read_agent,
    read_states,
    resume_files,
    run_folder,
    seed_file,
    training_keys,
    why,
)
from rlspeed.config import RunConfig, is_fused
from rlspeed.config_tree import check_creatable, flatten
from rlspeed.core.state import weights
from rlspeed.errors import ConfigError
from rlspeed.evaluate import SavedAgents, load_agents, saved_run_config
from rlspeed.registry import ALGOS, TASKS
from rlspeed.saved_config import read_config
from rlspeed.video import check_filmable, video_suffixes

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.core import AgentCheckpoint

MODES = ("train", "eval")
# What a host-driven (False) and a fused (True) run's resume files hold beside the format,
# the config's training keys, the monitor's state and the tracked run's id.
STATE_KEYS = {False: ("step", "updates", "obs", "parts"), True: ("state", "iterations")}


def check_modes(cfg: RunConfig) -> tuple[dict[int, dict[str, Any]], SavedAgents | None]:
    """``mode``, ``resume``, ``checkpoint``, ``video`` and ``video_every``: one ConfigError
    line for a value that cannot work (called by ``check``). Returns what the run takes from
    the folders it names: resume=: seed index -> saved state; mode=eval: the checkpoint's
    saved config and agents."""
    if cfg.mode not in MODES:
        raise ConfigError("mode", cfg.mode, f"one of {', '.join(MODES)}")
    if cfg.mode == "train":
        for key in ("checkpoint", "video"):
            if (value := getattr(cfg, key)) is not None:
                raise ConfigError(key, value, "null unless mode=eval")
        if cfg.video_every > 0:
            task = TASKS.get(cfg.task.name)
            check_filmable("video_every", cfg.video_every, "0 (off)", task, cfg.task)
        return (check_resume(cfg) if cfg.resume is not None else {}), None
    if cfg.resume is not None:
        raise ConfigError("resume", cfg.resume, "null with mode=eval (use checkpoint=PATH)")
    if cfg.video_every > 0:
        raise ConfigError("video_every", cfg.video_every, "0 with mode=eval (video=FILE films)")
    paths = agent_files(cfg.checkpoint) if cfg.checkpoint is not None else []
    if not paths or not (paths[0].parent / CONFIG_FILE).is_file():
        raise ConfigError(
            "checkpoint",
            cfg.checkpoint,
            "a run folder or a checkpoint file in one (checkpoint.pt, checkpoint.msgpack, "
            f"checkpoint_seed<i>.*) with its {CONFIG_FILE}",
        )
    assert cfg.checkpoint is not None  # it names agent files
    evaluated = load_agents(cfg.checkpoint)  # every agent read back now: a damaged file is one line
    if cfg.video is not None:
        check_video(cfg.video, evaluated[0])
    return {}, evaluated


def check_video(value: str, saved: RunConfig) -> None:
    """``video=value`` of mode=eval: a GIF (or MP4) file, an absolute one in a folder rlspeed
    can write to (a relative one goes into the eval's new folder), of a task filmed here."""
    suffixes = video_suffixes()
    path = Path(value).expanduser()
    # Path drops a trailing slash: x.gif/ names a folder, as does an existing folder x.gif.
    folder = value.endswith("/") or (path.is_absolute() and path.is_dir())
    if path.suffix.lower() not in suffixes or folder:
        extra = "" if ".mp4" in suffixes else " (.mp4 needs the imageio-ffmpeg package)"
        allowed = f"a file name ending in {', '.join(suffixes)}, not a folder{extra}"
        raise ConfigError("video", value, allowed)
    if path.is_absolute():
        allowed = "a file in an existing folder rlspeed can write to"
        if not path.parent.is_dir():
            raise ConfigError("video", value, allowed)
        check_creatable("video", value, path.parent, allowed)  # os.access says yes to root
    check_filmable("video", value, "null", TASKS.get(saved.task.name), saved.task)


def check_resume(cfg: RunConfig) -> dict[int, dict[str, Any]]:
    """``resume=PATH``: a run folder (or a file in one) whose ``config.yaml`` and resume
    files a run of this config wrote, whole. Returns seed index -> that agent's saved state;
    one ConfigError line otherwise. Only the files a run of ``cfg`` writes are read:
    ``resume.npz`` (one seed, or every seed of a fused run), else ``resume_seed<i>.npz`` for
    the seeds it reached."""
    value = cfg.resume
    assert value is not None  # resume= is set
    folder = run_folder(value)
    if not Path(value).expanduser().exists():
        raise ConfigError("resume", value, "an existing run folder or checkpoint file")
    saved_files, pickled = resume_files(folder), sorted(folder.glob(PICKLED_RESUME_FILES))
    if pickled and not saved_files:
        raise ConfigError(
            "resume",
            value,
            f"a run folder with {RESUME_FILE}: its {pickled[0].name} was saved by an older "
            "rlspeed in a format that is not read, for safety (reading a pickle can run "
            "code); start that run anew",
        )
    if not (folder / CONFIG_FILE).is_file():
        raise ConfigError(
            "resume",
            value,
            f"a run folder (or a file in one) with {RESUME_FILE} and {CONFIG_FILE}, "
            "as rlspeed runs write",
        )
    saved_config = read_config("resume", value, folder)
    if not saved_files:
        raise ConfigError("resume", value, _no_resume_state(value, folder, saved_config))
    current = training_keys(flatten(cfg))
    saved = training_keys(flatten(saved_config))
    _same_config(value, saved, current, "it ran with")
    _added_keys_at_default(value, cfg, saved, current)
    fused = is_fused(cfg)
    resume = folder / RESUME_FILE
    if cfg.num_seeds == 1 or fused:
        wanted = {0: resume}
    else:
        wanted = {i: seed_file(resume, i) for i in range(cfg.num_seeds)}
    # A host-driven seed the run had not reached has no file.
    paths = {index: path for index, path in wanted.items() if path.is_file()}
    if not paths:
        names = ", ".join(path.name for path in wanted.values())
        raise ConfigError("resume", value, f"a run folder with this config's {names}")
    states = read_states(value, paths)
    for path, state in zip(paths.values(), states.values(), strict=True):
        _same_config(value, training_keys(state["config"]), current, f"its {path.name} has")
        if missing := [key for key in STATE_KEYS[fused] if key not in state]:
            kind = "fused" if fused else "host-driven"
            raise ConfigError(
                "resume", value, f"a {path.name} of a {kind} run (it has no {missing[0]})"
            )
    trained = max(_trained_steps(state, fused) for state in states.values())
    if cfg.total_steps < trained:
        raise ConfigError(
            "total_steps",
            cfg.total_steps,
            f">= {trained:,}, the env steps the run in resume={value} has trained "
            "(a resumed run trains on from there; a larger total_steps extends it)",
        )
    return states


def _trained_steps(state: dict[str, Any], fused: bool) -> int:
    """The env steps (per seed) a saved state has trained: a host-driven seed's counter; on
    the fused path, which logs every chunk it keeps, the monitor's count of its seeds."""
    if not fused:
        return int(state["step"])
    streams = state.get("monitor", {}).get("streams", [])
    return max((int(stream["steps"]) for stream in streams), default=0)


def _no_resume_state(value: str, folder: Path, saved: Any) -> str:
    """What resume= expects of a run folder without a resume file, and what to do instead:
    its agent file still starts a new run (init_from=)."""
    trial = saved.get("trial", {})
    if trial.get("number") is not None and not trial.get("keep_resume", False):
        why = (
            f"this one is trial {trial.get('number')} of a sweep, whose resume state is "
            "dropped when a trial ends unless hydra.sweeper.keep_resume=true"
        )
    else:
        why = f"this one has none: its env's state cannot be saved, or {RESUME_FILE} was removed"
    instead = ""
    if agent_files(str(folder)):
        source = value if agent_files(value) else str(folder)
        instead = f"; init_from={source} starts a new run from its agent's weights"
    return f"a run folder with {RESUME_FILE} ({why}){instead}"


def _same_config(value: str, saved: dict[str, Any], current: dict[str, Any], ran: str) -> None:
    # Keys both have: a key added to rlspeed since that run has its default there. A larger
    # total_steps extends the run (checked against the steps it trained: check_resume).
    for key in sorted(saved.keys() & current.keys() - {"total_steps"}):
        if saved[key] != current[key]:
            raise ConfigError(
                "resume",
                value,
                f"a run of this config ({ran} {key}={saved[key]}, this run has "
                f"{key}={current[key]}); repeat that run's settings",
            )


def _added_keys_at_default(
    value: str, cfg: RunConfig, saved: dict[str, Any], current: dict[str, Any]
) -> None:
    """A run saved before rlspeed had a setting ran as its default does: continuing it with
    another value (an algorithm's option that a task's defaults turn on, say) would change
    it midway."""
    schemas = {"algo": ALGOS.get(cfg.algo.name).schema, "task": TASKS.get(cfg.task.name).schema}
    for key in sorted(current.keys() - saved.keys()):
        group, _, name = key.partition(".")
        if group not in schemas or "." in name:
            continue
        default = getattr(schemas[group](), name, current[key])
        if current[key] != default:
            raise ConfigError(
                "resume",
                value,
                f"a run of this config (it ran before rlspeed had {key}, as its default "
                f"{key}={default}; this run has {key}={current[key]}); set {key}={default}",
            )


def check_init_from(cfg: RunConfig) -> AgentCheckpoint | None:
    """``init_from=PATH``: a run folder of one agent, or one agent file in a folder with its
    config.yaml, whose agent this run's networks can take: the same algorithm and backend
    (the file's format), the same observation and action spaces, arrays of the shapes this
    run's config builds. Returns that agent's weights (its optimizer states left out), read
    as mode=eval reads agents (nothing in the folder runs); one ConfigError line otherwise.
    A resumed run continues its own agent: nothing is read (None)."""
    value = cfg.init_from
    if value is None or cfg.resume is not None:
        return None
    if cfg.mode != "train":
        raise ConfigError("init_from", value, "null unless mode=train")
    paths = agent_files(value)
    if not paths or not (paths[0].parent / CONFIG_FILE).is_file():
        raise ConfigError(
            "init_from",
            value,
            "a run folder or a checkpoint file in one (checkpoint.pt, checkpoint.msgpack, "
            f"checkpoint_seed<i>.*) with its {CONFIG_FILE}",
        )
    if len(paths) > 1:
        names = ", ".join(path.name for path in paths)
        raise ConfigError("init_from", value, f"one agent: one of its files ({names})")
    read = read_config("init_from", value, paths[0].parent)
    for key in ("algo", "backend"):  # before the saved config is typed by its algo's schema
        ours, theirs = getattr(cfg, key).name, read[key].name
        if ours != theirs:
            raise ConfigError(
                "init_from",
                value,
                f"an agent of this run's {key}={ours} (it was trained with {key}={theirs})",
            )
    saved = saved_run_config(read)
    if is_fused(saved) and saved.num_seeds > 1:
        raise ConfigError(
            "init_from",
            value,
            f"one agent (its {paths[0].name} holds the {saved.num_seeds} seeds of one fused "
            "run; train one seed, or start from a run of one)",
        )
    obs_space, action_space = _spaces(cfg, value, saved)
    try:
        with warnings.catch_warnings():
            # A file that is not what it should be can make a loader warn before it fails.
            warnings.simplefilter("ignore")
            agent = read_agent(paths[0], cfg.backend.name)
            # The agent as this run's networks, one seed's: what does not fit is refused.
            one = dataclasses.replace(cfg, num_seeds=1)
            module = ALGOS.get(cfg.algo.name).backend_module(cfg.backend.name)
            module.load_policies(one, agent, obs_space, action_space)
    except Exception as error:  # damaged, cut short, of other shapes
        raise ConfigError(
            "init_from",
            value,
            f"an agent whose arrays fit the networks this run builds, as its run's network "
            f"settings did ({why(error)})",
        ) from None
    if "obs_norm" in agent:
        raise ConfigError(
            "init_from",
            value,
            "an agent trained without algo.normalize_obs (its observation statistics are "
            "not carried into a new run)",
        )
    return weights(agent)


def _spaces(cfg: RunConfig, value: str, saved: RunConfig) -> tuple[spaces.Space[Any], ...]:
    """This run's observation and action spaces; ConfigError unless the saved agent's run
    had the same."""
    built = []
    for run in (cfg, saved):
        env = TASKS.get(run.task.name).make_env(run.task)
        built.append((env.observation_space, env.action_space))
        env.close()
    (ours, theirs) = built
    for what, mine, its in zip(("observations", "actions"), ours, theirs, strict=True):
        if mine != its:
            raise ConfigError(
                "init_from",
                value,
                f"an agent for this run's {what}, {_short(mine)} (it was trained on "
                f"task={saved.task.name}'s {_short(its)})",
            )
    return ours


def _short(space: spaces.Space[Any]) -> str:
    """A space as one short phrase (Doors' MultiDiscrete lists 225 numbers)."""
    text = str(space)
    return text if len(text) <= 60 else f"{type(space).__name__} of shape {space.shape}"
