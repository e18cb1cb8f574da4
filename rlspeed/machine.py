"""Facts about the machine that bound what a user may ask for (sizes, workers)."""

from __future__ import annotations

import os


def physical_memory() -> int:
    """Bytes of RAM this machine has."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
