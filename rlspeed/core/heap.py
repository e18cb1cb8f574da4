"""Freed heap memory handed back to the system while a host learner trains.

glibc keeps what a process frees on its heap for reuse. A torch learner's updates allocate
and free buffers of 256 KB to 1 MB each (a 256x256 layer's weights, gradients and
activations) between smaller long-lived objects, and the heap around them grows without
being returned: TD3 on Ant-v5 (torch, 1e6 buffer, 24k random steps then 1,000 updates)
peaked at 738-839 MiB, CleanRL's td3_continuous_action.py at 364 MiB. ``malloc_trim(0)``
every 50 updates gives the free pages back (440 MiB, 141 against 137 updates/s); glibc's
tunables do it only by sending those sizes to mmap (MALLOC_MMAP_THRESHOLD_=262144: 456 MiB
at 84 updates/s). Elsewhere than glibc there is nothing to call, and nothing is done."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

# Gradient updates between two trims: each trim walks the heap (about a millisecond).
TRIM_EVERY = 50


def _malloc_trim() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    return None if trim is None else lambda: trim(0)


_TRIM = _malloc_trim()


class HeapTrimmer:
    """Counts a learner's updates and hands freed heap memory back every ``every``."""

    def __init__(self, every: int = TRIM_EVERY) -> None:
        self.every, self.since = every, 0

    def updated(self, updates: int) -> None:
        self.since += updates
        if self.since >= self.every and _TRIM is not None:
            self.since = 0
            _TRIM()
