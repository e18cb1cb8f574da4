"""How observations enter a network, decided once from the observation space.

Categorical observations (a ``Discrete`` tabular index, Doors' ``MultiDiscrete`` cell
codes) are one-hot encoded per entry, as Stable-Baselines3 does: fed as raw numbers,
Doors' agent (1) and goal (3) in the top row would share one input weight, and the
agent never learns the last steps into the goal. Continuous observations enter as is;
images (a Box of H x W x C) go through a conv torso first, unless ``algo.network=mlp``
(``rlspeed.core.algos.networks``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from rlspeed.core.algos.networks import takes_torso
from rlspeed.core.tasks._spaces import image_shape


def one_hot_classes(space: spaces.Space[Any]) -> int:
    """One-hot classes per observation entry (categorical spaces), 0 for continuous."""
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.max(space.nvec))
    return 0


def input_size(space: spaces.Space[Any]) -> int:
    entries = int(np.prod(space.shape)) if space.shape else 1
    return entries * (one_hot_classes(space) or 1)


def through_torso(space: spaces.Space[Any], network: str) -> bool:
    """Whether observations of ``space`` go through the conv torso with
    ``algo.network=network``."""
    return takes_torso(network, image_shape(space))
