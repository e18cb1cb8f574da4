"""Checkpoints: one place for how they are written (atomically), what a resume needs and how
it is read back.

A run folder holds, per agent, two files:

* ``checkpoint.pt`` (torch) or ``checkpoint.msgpack`` (flax): the agent's networks (and
  optimizer state on torch), the file ``mode=eval`` loads and users load themselves;
* ``resume.npz``: everything ``resume=`` needs to continue the run where it stopped, as of
  the end of the last whole iteration (the step and update counters, the learner's networks,
  optimizer and random generators, the replay buffer, the envs' state and latest
  observations, the metrics recorded so far and the config's training keys). On the fused
  ``flax`` + ``jax-vmap`` path it is the whole train state (buffer, envs, keys).

Nothing read back can run code: resume state is a ``rlspeed.statefile`` archive (JSON and
NumPy arrays, read with ``allow_pickle=False``), torch checkpoints are read with
``weights_only=True`` and flax ones are msgpack. The ``resume.pkl`` pickles of older versions
are refused, never read. Resume files are read (``read_states``), and checked against the
run's config (``rlspeed.run_folders``), when the config is checked: a damaged or foreign one
is one line before any folder exists. This module only reads and writes: the
parts give and take their state as trees of arrays (``rlspeed.core.state``), and when a run
writes is ``rlspeed.recording.CheckpointSchedule``'s call.

With ``num_seeds`` > 1 on a host-driven path, each agent's files end in ``_seed<i>``.
Every write goes to a temporary file in the same folder, is flushed to disk, then renamed
over the old file: a crash or a full disk leaves the previous file or none, never half of one.

Torch, JAX and Gymnasium are imported only where a checkpoint of theirs is handled, so a
torch run never loads JAX (and the reverse).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any

from rlspeed import digests, statefile
from rlspeed.errors import ConfigError
from rlspeed.machine import physical_memory

RESUME_FILE = "resume.npz"
# What versions before the resume.npz format wrote: pickles, refused unread.
PICKLED_RESUME_FILES = "resume*.pkl"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
# A run's config.yaml is a few kilobytes: a larger one is not a run's (and would stall).
CONFIG_BYTES = 1 << 20
# Keys every rlspeed config.yaml has: one without them (an empty file) is not a run's.
IDENTITY_KEYS = ("algo.name", "backend.name", "env.name", "task.name")
AGENT_FILES = ("checkpoint.pt", "checkpoint.msgpack")
# Bumped when what the resume file holds changes shape (1: resume.pkl; 2: replay buffers
# with two observations per transition).
FORMAT = 3
# Keys a resumed run may change: where and how it reports, not what it trains. The thread
# count and compile cache only set how fast (a run resumed on another machine, or one saved
# before threads=auto resolved to a number, may use another count).
FREE_KEYS: tuple[str, ...] = ("resume", "mode", "checkpoint", "video", "progress")
FREE_KEYS += ("tracking.", "trial.", "backend.compilation_cache", "backend.threads")
FREE_KEYS += ("checkpoint_every", "env.step_timeout_s")
# Where a fused run's lanes run: a run started on 4 devices resumes on 1 and the other way.
FREE_KEYS += ("backend.devices",)
# How many processes a host-driven run's seeds train in: each seed's numbers are the same.
FREE_KEYS += ("backend.seed_workers",)


# ---------------------------------------------------------------- writing


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """``write(file)`` into a temporary file beside ``path``, fsync it, then rename it over
    ``path``, its digest recorded in the folder's manifest (``rlspeed.digests``); on any
    error the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        with digests.recording(path, digests.of_file(tmp)):
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return path


def save_torch(obj: Any, path: Path) -> Path:
    import torch

    return atomic_write(path, lambda file: torch.save(obj, file))


def save_pytree(tree: Any, path: Path) -> Path:
    """A JAX pytree as flax msgpack (``flax.serialization.from_bytes`` reads it)."""
    import flax.serialization
    import jax

    data = flax.serialization.to_bytes(jax.device_get(tree))
    return atomic_write(path, lambda file: file.write(data))


def save_resume(state: dict[str, Any], path: Path) -> Path:
    return atomic_write(path, partial(statefile.dump, {"format": FORMAT, **state}))


# ---------------------------------------------------------------- reading


def run_folder(value: str) -> Path:
    """The run folder of ``resume=`` / ``checkpoint=``: the folder itself or a file's folder."""
    path = Path(value).expanduser()
    return path if path.is_dir() else path.parent


def resume_files(folder: Path) -> dict[int, Path]:
    """Seed index -> that agent's resume file (index 0 holds every seed on the fused path)."""
    files = {}
    if (folder / RESUME_FILE).is_file():
        files[0] = folder / RESUME_FILE
    name = Path(RESUME_FILE)
    for path in folder.glob(f"{name.stem}_seed*{name.suffix}"):
        index = path.stem.removeprefix(f"{name.stem}_seed")
        if index.isdigit():
            files[int(index)] = path
    return files


def seed_file(path: Path, index: int) -> Path:
    """The file of seed ``index`` of a run whose seeds are saved one by one."""
    return path.with_name(f"{path.stem}_seed{index}{path.suffix}")


def training_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """The keys of a flattened config (``rlspeed.config.flatten``) a resumed run must share."""
    return {
        key: value
        for key, value in flat.items()
        if not any(key == free or key.startswith(free) for free in FREE_KEYS)
    }


def read_metrics(folder: Path) -> dict[str, Any]:
    """A run's metrics.json, checked whole (its digest) before it is parsed."""
    path = Path(folder) / METRICS_FILE
    check_whole(path, "metrics file")
    metrics = json.loads(path.read_text())
    if not isinstance(metrics, dict):
        raise ValueError(f"{METRICS_FILE} holds no mapping")
    return metrics


def check_whole(path: Path, what: str) -> None:
    """DigestError unless ``path`` is the file rlspeed wrote there, and one that fits in
    memory (it is read whole)."""
    digests.check(path, physical_memory(), what)


def why(error: Exception) -> str:
    """An exception in one short line: its type and the start of its message (torch's
    run to paragraphs); a file that is not the one rlspeed wrote, in rlspeed's own words."""
    if isinstance(error, digests.DigestError):
        return str(error)
    message = " ".join(str(error).split())
    if len(message) > WHY_LENGTH:
        message = message[:WHY_LENGTH].rsplit(" ", 1)[0] + " ..."
    return f"{type(error).__name__}: {message}"


# Characters of an exception's message that ``why`` keeps.
WHY_LENGTH = 160


def read_states(value: str, paths: dict[int, Path]) -> dict[int, dict[str, Any]]:
    """Seed index -> the state saved in that path; one ConfigError line for a file that is
    damaged or of another format."""
    states = {}
    for index, path in paths.items():
        try:
            check_whole(path, "resume file")
            state = statefile.load(path)
        except Exception as error:  # truncated, corrupt, a pickle, an object array
            reason = f"a readable {path.name} ({why(error)})"
            raise ConfigError("resume", value, reason) from None
        if not (isinstance(state, dict) and state.get("format") == FORMAT):
            got = state.get("format") if isinstance(state, dict) else None
            older = (
                f" (it has format {got}: an earlier rlspeed's, whose state this one does "
                "not read; start that run anew)"
                if isinstance(got, int) and 0 < got < FORMAT
                else ""
            )
            raise ConfigError("resume", value, f"a {path.name} of format {FORMAT}{older}")
        if not isinstance(state.get("config"), dict):
            raise ConfigError("resume", value, f"a {path.name} with its run's config")
        states[index] = state
    return states


def agent_files(value: str) -> list[Path]:
    """The agent checkpoints of ``checkpoint=PATH``: the file, or every one in the folder."""
    path = Path(value).expanduser()
    if path.is_file() and path.name.startswith("checkpoint"):
        return [path]
    if path.is_dir():
        found = [p for name in AGENT_FILES if (p := path / name).is_file()]
        return found + sorted(path.glob("checkpoint_seed*.*"))
    return []


def read_agent(path: Path, backend: str) -> dict[str, Any]:
    """An agent file of a ``backend`` run as the tree its learner saved (``write_agent``),
    checked whole first: torch's through ``torch.load(weights_only=True)`` onto the CPU
    (tensors only: nothing in it runs code), flax's as msgpack's nested dict of NumPy
    arrays. The format is the run's backend's, whatever the file's name. The algorithm's
    ``load_policies`` puts the tree into its networks."""
    path = Path(path)
    check_whole(path, "agent file")
    saved: object
    if backend == "torch":
        import torch

        saved = torch.load(path, weights_only=True, map_location="cpu")
    else:
        import flax.serialization

        saved = flax.serialization.msgpack_restore(path.read_bytes())
    if not isinstance(saved, dict):
        raise ValueError(f"{path.name} holds no mapping")
    return saved


def write_agent(tree: dict[str, Any], path: Path) -> Path:
    """Write a learner's ``agent_checkpoint()`` tree as its agent file: torch's with
    ``torch.save`` (``.pt``), JAX's as flax msgpack (``.msgpack``)."""
    return save_torch(tree, path) if Path(path).suffix == ".pt" else save_pytree(tree, path)
