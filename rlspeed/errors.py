"""Errors that reach the user as one clear line."""

from __future__ import annotations

from hydra.errors import CompactHydraException


class RLSpeedError(CompactHydraException):
    """An error Hydra prints as its message alone (no traceback), exit code 1."""


class ConfigError(RLSpeedError):
    """A config value that is not allowed: names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"rlspeed: invalid {key}={value!s}: expected {allowed}")

    def __reduce__(self) -> tuple:
        # Jobs in other processes (hydra/launcher=joblib) send their exception back pickled.
        return (type(self), (self.key, self.value, self.allowed))


class DivergenceError(RLSpeedError):
    """Training produced a non-finite loss; stopping beats training on garbage."""
