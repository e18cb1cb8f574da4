"""What the tasks built on MuJoCo models share: MuJoCo's warnings in the log, not on stderr."""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)


@functools.cache
def _log_mujoco_warning(message: str) -> None:
    # Cached: each distinct message is logged once per process, not once per env built.
    log.warning("MuJoCo: %s", message)


def log_mujoco_warnings() -> None:
    """Route MuJoCo's warnings to the log. MuJoCo's own handler prints to stderr and appends
    to MUJOCO_LOG.TXT in the working directory; MuJoCo 4 warns there at every build of a
    model with a deprecated XML attribute (Gymnasium's HalfCheetah, the DM Control suite's
    cheetah). The handler must not raise: it is called from C."""
    import mujoco

    mujoco.set_mju_user_warning(_log_mujoco_warning)
