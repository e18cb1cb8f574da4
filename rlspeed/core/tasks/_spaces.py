"""What fits a task whose env's spaces depend on its settings (``task=gym``, ``task=gymnax``):
every answer its spec gives (which algorithms fit, observation bytes, network inputs, the
tabular state) comes from the env's spaces, read once per settings by the task (``facts``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, cast

from rlspeed.config import TaskConfig
from rlspeed.core.tasks import AlgoKinds, TabularSpec
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS

# Gymnasium (and NumPy) load when an env is built or checked, not when the task is chosen.
if TYPE_CHECKING:
    from types import ModuleType

    import gymnasium as gym

    from rlspeed.core import XpArray

# ``AlgoSpec.observation_kinds`` by observation space, and how each kind is named to a user.
OBSERVATION_KINDS = {"Box": "continuous", "Discrete": "categorical", "MultiDiscrete": "categorical"}
OBSERVATION_NAMES = {"continuous": "Box", "categorical": "Discrete or MultiDiscrete"}
ACTION_NAMES = {"discrete": "Discrete", "continuous": "bounded 1-D Box"}


class EnvFacts(NamedTuple):
    """What the checks and the networks need to know of one env."""

    observation_space: Any
    action_space: Any
    # The env's own episode limit (None where it has none).
    max_episode_steps: int | None


def describe(space: gym.Space[Any]) -> str:
    """A space on one line: as Gymnasium prints it, or its type, shape and dtype where that
    is long (a Box's bounds print entry by entry where they differ)."""
    shown = " ".join(str(space).split())
    return shown if len(shown) <= 100 else f"{type(space).__name__}({space.shape}, {space.dtype})"


def _from_zero(space: gym.Space[Any]) -> bool:
    """Categorical values from 0: one-hot classes, table rows and network outputs index them."""
    import numpy as np

    return not np.any(getattr(space, "start", 0))


def observation_kind(space: gym.Space[Any]) -> str | None:
    kind = OBSERVATION_KINDS.get(type(space).__name__)
    return None if kind == "categorical" and not _from_zero(space) else kind


def action_kind(space: gym.Space[Any]) -> str | None:
    """``AlgoSpec.action_kinds``' name for the space, None where no algorithm takes it."""
    name = type(space).__name__
    if name == "Discrete" and _from_zero(space):
        return "discrete"
    box = cast("gym.spaces.Box", space)  # read only where its class is named Box
    if name == "Box" and len(box.shape) == 1 and box.shape[0] >= 1 and box.is_bounded():
        return "continuous"
    return None


def entries(space: gym.Space[Any]) -> int:
    import numpy as np

    # Box, Discrete and MultiDiscrete, the kinds a task lets through, have a shape.
    return int(np.prod(cast("tuple[int, ...]", space.shape)))


def image_shape(space: gym.Space[Any]) -> tuple[int, int, int] | None:
    """(H, W, C) of image observations (a Box of rank 3: MinAtar's grids, camera frames),
    None for any other."""
    shape = space.shape
    if observation_kind(space) != "continuous" or shape is None or len(shape) != 3:
        return None
    height, width, channels = shape
    return height, width, channels


def check_observations(space: gym.Space[Any], key: str, value: object) -> None:
    """One ConfigError line for an env whose observations no network or table takes."""
    if observation_kind(space) is None or entries(space) == 0:
        kinds = "Box, Discrete or MultiDiscrete (from 0)"
        allowed = f"an env with {kinds} observations of 1 entry or more, not {describe(space)}"
        raise ConfigError(key, value, allowed)


def _class_counts(space: gym.spaces.Discrete | gym.spaces.MultiDiscrete) -> list[int]:
    """Classes of each entry of a categorical observation, row-major."""
    import numpy as np

    return [int(n) for n in np.ravel(space.nvec)] if hasattr(space, "nvec") else [int(space.n)]


Settings = TypeVar("Settings", bound=TaskConfig)


@dataclass(frozen=True)
class SpaceAnswers(Generic[Settings]):
    """The answers of task ``task`` (its ``TaskSpec`` fields), from ``facts(cfg)``, its
    env's spaces at settings ``cfg``; the env is named ``task.id`` in errors."""

    task: str
    facts: Callable[[Settings], EnvFacts]

    def check_algo(self, cfg: Settings, algo: AlgoKinds) -> None:
        """Refuse an algorithm that cannot work with the env's spaces, naming the space."""
        facts = self.facts(cfg)
        actions, observations = facts.action_space, facts.observation_space
        kinds = (action_kind(actions), observation_kind(observations))
        fits = [
            other.name
            for other in ALGOS
            if kinds[0] in other.action_kinds
            and kinds[1] in other.observation_kinds
            and (other.tasks is None or self.task in other.tasks)
        ]
        if kinds[0] not in algo.action_kinds:
            what, space, needs = "actions", actions, [ACTION_NAMES[k] for k in algo.action_kinds]
        elif kinds[1] not in algo.observation_kinds:
            what, space = "observations", observations
            needs = [OBSERVATION_NAMES[k] for k in algo.observation_kinds]
        else:
            return
        env_id = getattr(cfg, "id", cfg.name)
        raise ConfigError(
            "algo",
            algo.name,
            f"an algorithm for task.id={env_id}'s {what}, {describe(space)} ({algo.name} needs "
            f"{' or '.join(needs)} {what}): {', '.join(fits) or 'none fits this env'}",
        )

    def observation_bytes(self, cfg: Settings) -> int:
        space = self.facts(cfg).observation_space
        itemsize: int = space.dtype.itemsize
        return entries(space) * itemsize

    def network_inputs(self, cfg: Settings) -> int:
        """The observation's entries, times the most classes of one where they are
        categorical (``rlspeed.core.algos.encoding.input_size``, which the networks are
        built with)."""
        space = self.facts(cfg).observation_space
        if observation_kind(space) == "continuous":
            return entries(space)
        counts = _class_counts(space)
        return len(counts) * max(counts)

    def image_shape(self, cfg: Settings) -> tuple[int, int, int] | None:
        return image_shape(self.facts(cfg).observation_space)

    def num_states(self, cfg: Settings) -> int:
        return math.prod(_class_counts(self.facts(cfg).observation_space))

    def num_actions(self, cfg: Settings) -> int:
        return int(self.facts(cfg).action_space.n)

    def state_index(self, cfg: Settings, obs: XpArray, xp: ModuleType) -> Any:
        """A categorical observation's entries read as one mixed-radix number (row-major)."""
        counts = _class_counts(self.facts(cfg).observation_space)
        places = [math.prod(counts[i + 1 :]) for i in range(len(counts))]
        flat = obs.reshape(obs.shape[0], -1).astype(xp.int32)
        return (flat * xp.asarray(places, dtype=xp.int32)).sum(axis=-1).astype(xp.int32)

    def categorical(self, cfg: Settings) -> bool:
        return observation_kind(self.facts(cfg).observation_space) == "categorical"

    def tabular(self) -> TabularSpec:
        return TabularSpec(
            num_states=self.num_states,
            state_index=self.state_index,
            num_actions=self.num_actions,
            categorical=self.categorical,
        )
