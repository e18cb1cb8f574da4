"""rlspeed: fast RL training tool. From Python: ``rlspeed.train(...)`` and
``rlspeed.load(folder)`` (``rlspeed.api``)."""

from typing import Any

# Loaded on first use: ``import rlspeed`` (and the command's start) stays instant.
_API = ("Agent", "Result", "load", "train")


def __getattr__(name: str) -> Any:
    if name in _API:
        from rlspeed import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlspeed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
