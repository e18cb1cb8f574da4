"""A user's module (``task.import``, the ``module:`` of a Gymnasium id) imported for rlspeed:
first in a child process, so that one that exits, ends its process or hangs as it is
imported is one line naming it, rather than rlspeed ending with it (``sys.exit(0)`` would end
it with exit code 0, having done nothing); then in this process."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import subprocess
import sys

from rlspeed.errors import ConfigError, one_line

# Seconds an import may take in the child before it is taken to hang.
IMPORT_TIMEOUT_S = 120
_IMPORTED = "rlspeed: imported"


@functools.cache
def import_user_module(key: str, module: str) -> None:
    """Import ``module`` (the value of config key ``key``); one ConfigError line if it
    raises, exits, ends its process or hangs."""
    if module in sys.modules:
        return
    if multiprocessing.parent_process() is None:  # a gym-async worker's parent has tried it
        _try_in_a_child(key, module)
    try:
        importlib.import_module(module)
    except (Exception, SystemExit) as error:  # missing, failing or exiting as it runs
        raise ConfigError(key, module, f"a module Python can import ({_said(error)})") from None


def _try_in_a_child(key: str, module: str) -> None:
    code = (
        f"import importlib, sys; sys.path[:0] = {sys.path!r}; "
        f"importlib.import_module({module!r}); print({_IMPORTED!r})"
    )
    try:
        child = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        allowed = f"a module that imports within {IMPORT_TIMEOUT_S} s (importing it hung)"
        raise ConfigError(key, module, allowed) from None
    if _IMPORTED in child.stdout:
        return
    lines = child.stderr.strip().splitlines()
    said = lines[-1] if child.returncode == 1 and lines else ""
    if not said or said.startswith(" "):  # no exception's last line: the process was ended
        said = f"importing it ended its process with exit code {child.returncode}"
    raise ConfigError(key, module, f"a module Python can import ({' '.join(said.split())})")


def _said(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"importing it called sys.exit({error.code!r})"
    return one_line(error)
