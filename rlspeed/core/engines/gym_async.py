"""``env=gym-async``: gymnasium.vector.AsyncVectorEnv, one subprocess per copy, shared memory."""

import resource
from functools import partial

from rlspeed.core.engines import EngineSpec
from rlspeed.core.engines.gym_vector import make_vector_engine
from rlspeed.machine import physical_memory

# What each worker process takes: its own memory (CartPole's forked workers: 4.6 MB each,
# measured at 64; a MuJoCo task's more), file descriptors in the main process (3 each,
# measured: its pipe and process handle) and a process id. Past what the machine allows,
# the start fails partway or the OOM killer ends the run.
WORKER_BYTES = 16 * 2**20
WORKER_FILES = 4
# Descriptors the main process keeps for itself (logs, the tracking store, libraries).
OWN_FILES = 256


def max_workers() -> int:
    """Worker processes this machine's memory, open-file and process limits leave room for."""
    limits = [physical_memory() // WORKER_BYTES]
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if files != resource.RLIM_INFINITY:
        limits.append(max(1, (files - OWN_FILES) // WORKER_FILES))
    processes = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if processes != resource.RLIM_INFINITY:  # shared with every process of this user
        limits.append(max(1, processes // 2))
    return min(limits)


SPEC = EngineSpec(
    name="gym-async",
    needs_functional_env=False,
    make=partial(make_vector_engine, asynchronous=True),
    max_envs=max_workers,
)
