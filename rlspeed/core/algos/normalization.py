"""Running statistics an on-policy learner normalises with (PPO's ``algo.normalize_obs`` and
``algo.scale_rewards``), as pure functions of NumPy or JAX arrays (``xp=np`` / ``xp=jnp``):
the host learners of both backends hold them in NumPy (``HostNormalization``), so torch and
flax normalise alike; the fused path carries the same ``NormState`` in its ``lax.scan``.

- Observations: the running mean and (population) variance of every observation the agent
  acted on, updated once per env step with the batch of every env's (Chan et al.'s
  parallel update), then ``(obs - mean) / sqrt(var + EPS)`` clipped to +-``obs_clip``. A
  final observation (a truncated episode's bootstrap) is normalised, not counted.
- Rewards: each env's discounted return so far (``gamma``), whose running variance over
  all envs and steps scales the rewards, ``reward / sqrt(var + EPS)`` clipped to
  +-``reward_clip`` (Gymnasium's NormalizeReward, as CleanRL's continuous PPO uses it); a
  return restarts where an episode ends. Scores and episode returns stay on raw rewards.

The observation statistics are part of the agent (checkpoints hold them, ``mode=eval`` and
the greedy evaluation normalise with them); both are part of a resume's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from rlspeed.core.algos.encoding import one_hot_classes
from rlspeed.errors import ConfigError

if TYPE_CHECKING:
    from types import ModuleType

    import jax
    from gymnasium import spaces

    from rlspeed.core import XpArray

# Added to the variance before its square root: a constant entry divides by 1e-4, not 0.
EPS = 1e-8


class NormSettings(NamedTuple):
    normalize_obs: bool
    obs_clip: float
    scale_rewards: bool
    reward_clip: float


class Moments(NamedTuple):
    """Count, mean and population variance of the samples seen (float32)."""

    count: Any
    mean: Any
    var: Any


class NormState(NamedTuple):
    """What the statistics are now; a part that is off is None."""

    obs: Moments | None
    # Each env's discounted return so far [num_envs], and the moments of all of them.
    returns: Any
    return_moments: Moments | None


class NormalizationConfig(Protocol):
    """What ``settings_of`` reads of an algorithm's config (PPO's)."""

    @property
    def normalize_obs(self) -> bool: ...
    @property
    def obs_clip(self) -> float: ...
    @property
    def scale_rewards(self) -> bool: ...
    @property
    def reward_clip(self) -> float: ...


def settings_of(algo: NormalizationConfig, obs_space: spaces.Space[Any]) -> NormSettings | None:
    """The normalisation ``algo`` (PPO's config) asks for on ``obs_space``; None where
    nothing is on. Categorical observations are one-hot encoded: a normalised cell code is
    no class (``validate`` refuses the known tasks' before a run starts, a ``gym`` task's
    here)."""
    if algo.normalize_obs and one_hot_classes(obs_space):
        reason = "false for categorical (one-hot encoded) observations"
        raise ConfigError("algo.normalize_obs", algo.normalize_obs, reason)
    settings = NormSettings(
        bool(algo.normalize_obs),
        float(algo.obs_clip),
        bool(algo.scale_rewards),
        float(algo.reward_clip),
    )
    return settings if settings.normalize_obs or settings.scale_rewards else None


def moments(shape: tuple[int, ...], xp: ModuleType) -> Moments:
    """No samples yet: mean 0, variance 1 (normalising with them changes nothing)."""
    return Moments(
        xp.zeros((), xp.float32), xp.zeros(shape, xp.float32), xp.ones(shape, xp.float32)
    )


def init_state(
    settings: NormSettings | None, obs_shape: tuple[int, ...], num_envs: int, xp: ModuleType
) -> NormState | None:
    if settings is None:
        return None
    scaled = settings.scale_rewards
    return NormState(
        moments(obs_shape, xp) if settings.normalize_obs else None,
        xp.zeros(num_envs, xp.float32) if scaled else None,
        moments((), xp) if scaled else None,
    )


def updated(m: Moments, batch: XpArray, xp: ModuleType) -> Moments:
    """``m`` with the samples ``batch`` [n, *shape] added (Chan et al.'s parallel update)."""
    batch = batch.astype(xp.float32)
    n = batch.shape[0]
    total = m.count + n
    delta = batch.mean(axis=0) - m.mean
    mean = m.mean + delta * (n / total)
    squares = m.var * m.count + batch.var(axis=0) * n + delta**2 * (m.count * n / total)
    # An array, not NumPy's float32 scalar (checkpoints save arrays).
    return Moments(xp.asarray(total), mean, squares / total)


def standardized(m: Moments, obs: XpArray, clip: float, xp: ModuleType) -> Any:
    """Observations [B, *shape] by the moments ``m``, clipped to +-``clip``."""
    return xp.clip((obs.astype(xp.float32) - m.mean) / xp.sqrt(m.var + EPS), -clip, clip)


def observe(
    settings: NormSettings | None, state: NormState | None, obs: XpArray, xp: ModuleType
) -> tuple[NormState | None, Any]:
    """Count the envs' observations ``obs`` [N, *shape] and normalise them (as they are
    where observation normalisation is off)."""
    if settings is None or state is None or state.obs is None:
        return state, obs
    stats = updated(state.obs, obs, xp)
    return state._replace(obs=stats), standardized(stats, obs, settings.obs_clip, xp)


def normalize(
    settings: NormSettings | None, state: NormState | None, obs: XpArray, xp: ModuleType
) -> Any:
    """Observations normalised without counting them (final observations, evaluation)."""
    if settings is None or state is None or state.obs is None:
        return obs
    return standardized(state.obs, obs, settings.obs_clip, xp)


def scale_rewards(
    settings: NormSettings | None,
    state: NormState | None,
    rewards: XpArray,
    dones: XpArray,
    gamma: float | np.floating | jax.Array,
    xp: ModuleType,
) -> tuple[NormState | None, Any]:
    """One env step's rewards [N] scaled by the running std of the discounted return (as
    they are where reward scaling is off); ``dones`` [N] restart the returns after it."""
    if settings is None or state is None or state.return_moments is None:
        return state, rewards
    returns = state.returns * gamma + rewards.astype(xp.float32)
    stats = updated(state.return_moments, returns, xp)
    scaled = xp.clip(
        rewards / xp.sqrt(stats.var + EPS), -settings.reward_clip, settings.reward_clip
    )
    returns = xp.where(dones, xp.zeros_like(returns), returns)
    return state._replace(returns=returns, return_moments=stats), scaled.astype(xp.float32)


class HostNormalization:
    """A host learner's statistics (NumPy, the same on torch and flax): what
    ``rollout.Rollout.collect`` normalises with; its ``state_dict`` is the resume's."""

    def __init__(
        self, settings: NormSettings, obs_shape: tuple[int, ...], num_envs: int, gamma: float
    ) -> None:
        self.settings, self.gamma = settings, gamma
        self.state = init_state(settings, obs_shape, num_envs, np)

    def observe(self, obs: XpArray) -> np.ndarray:
        seen: np.ndarray
        self.state, seen = observe(self.settings, self.state, np.asarray(obs), np)
        return seen

    def normalize(self, obs: XpArray) -> Any:
        return normalize(self.settings, self.state, np.asarray(obs), np)

    def rewards(self, rewards: XpArray, dones: XpArray) -> Any:
        rewards = np.asarray(rewards, dtype=np.float32)
        self.state, scaled = scale_rewards(
            self.settings, self.state, rewards, np.asarray(dones), np.float32(self.gamma), np
        )
        return scaled

    def obs_moments(self) -> dict[str, np.ndarray] | None:
        """The observation statistics as a checkpoint holds them (None where off)."""
        assert self.state is not None  # built with a setting on
        return None if self.state.obs is None else self.state.obs._asdict()

    def load_obs_moments(self, saved: dict[str, Any]) -> None:
        """Put a checkpoint's observation statistics (``obs_moments``) back."""
        assert self.state is not None and self.state.obs is not None
        fields = {key: np.asarray(saved[key], np.float32) for key in Moments._fields}
        self.state = self.state._replace(obs=Moments(**fields))

    def state_dict(self) -> dict[str, Any]:
        assert self.state is not None
        return {name: np.array(value) for name, value in _flat(self.state).items()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        assert self.state is not None
        self.state = _unflat(self.state, saved)


def _flat(state: NormState) -> dict[str, Any]:
    """``state``'s arrays by a flat name (obs.mean, returns, ...)."""
    flat: dict[str, Any] = {}
    for name, part in state._asdict().items():
        if isinstance(part, Moments):
            flat.update({f"{name}.{key}": value for key, value in part._asdict().items()})
        elif part is not None:
            flat[name] = part
    return flat


def _unflat(template: NormState, saved: dict[str, Any]) -> NormState:
    parts: dict[str, Any] = {}
    for name, part in template._asdict().items():
        if isinstance(part, Moments):
            fields = {
                key: np.asarray(saved[f"{name}.{key}"], np.float32) for key in Moments._fields
            }
            parts[name] = Moments(**fields)
        else:
            parts[name] = None if part is None else np.asarray(saved[name], np.float32)
    return NormState(**parts)
