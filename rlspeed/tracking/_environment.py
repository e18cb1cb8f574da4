"""What a tracked run ran on (``environment_tags``): rlspeed's and its libraries' versions,
the source checkout's commit, the host, its CPU and GPUs, and the command line.

Made in the tracking writer (``_writer``), off training's path, from files and package
metadata only: nothing here imports torch or JAX, or asks a GPU driver.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shlex
import socket
import subprocess
from pathlib import Path

from rlspeed import secrets

# The libraries whose versions decide a run's numbers and how it is recorded.
LIBRARIES = ("jax", "flax", "torch", "gymnasium", "mlflow", "optuna", "wandb")
# `git rev-parse` on a slow network file system must not hold up the run's start.
GIT_TIMEOUT_S = 2.0


def environment_tags(command: list[str]) -> dict[str, str]:
    """Tags naming the run's software and machine; ``command``: its command line (every
    password in a URL masked). A fact that cannot be had cheaply is left out."""
    tags = {
        "rlspeed.version": _version("rlspeed"),
        **{f"rlspeed.version.{name}": _version(name) for name in LIBRARIES},
        "rlspeed.git_commit": git_commit(),
        "rlspeed.host": socket.gethostname(),
        "rlspeed.cpu": cpu_model(),
        "rlspeed.gpus": ", ".join(gpu_names()),
        "rlspeed.command": secrets.mask(shlex.join(command)),
    }
    return {key: value for key, value in tags.items() if value}


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def git_commit() -> str:
    """The commit of the git checkout rlspeed's source is in ("" where it is installed
    from a wheel: a site-packages folder inside some other repository does not count)."""
    source = Path(__file__).resolve().parents[2]  # the folder holding the rlspeed package
    try:
        found = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout, too slow
        return ""
    if len(found) != 2 or Path(found[0]).resolve() != source:
        return ""
    return found[1]


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor()


def gpu_names() -> list[str]:
    """NVIDIA GPUs' model names, as the driver lists them under /proc ([] elsewhere)."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            lines = info.read_text().splitlines()
        except OSError:
            continue
        names += [line.partition(":")[2].strip() for line in lines if line.startswith("Model:")]
    return names
