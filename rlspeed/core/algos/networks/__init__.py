"""The networks the algorithms share, one module per backend, with the same layers, init and
parameter names on both (flax's ``Conv_i`` and ``Dense_i``, torch's ``torso.<i>`` and
``net.<i>``), so weights carry over: the MLP (DQN, TD3, PQN, the on-policy networks), with a
conv torso in front for image observations, and the on-policy actor-critic (VPG, PPO); for
torch also the init and optimizers every torch learner builds with. Here: what both backends
build from, and the torso's size for the checks, which load neither."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

# Orthogonal init's gains (PPO's ``orthogonal_init``, CleanRL's and PureJaxRL's): hidden
# layers, the policy's output (near-uniform first actions), the value's output.
HIDDEN_GAIN, POLICY_GAIN, VALUE_GAIN = math.sqrt(2), 0.01, 1.0
# LayerNorm's epsilon on both backends (torch's default; flax's is 1e-6), so they agree.
LAYER_NORM_EPSILON = 1e-5

# ``algo.network`` (DQN, PQN, VPG, PPO): ``auto`` puts the conv torso in front of the MLP for
# image observations (a Box of H x W x C, ``rlspeed.core.tasks._spaces.image_shape``) and
# feeds any other observations to the MLP directly, ``mlp`` flattens images into it too,
# ``cnn`` asks for the torso (refused on observations that are no image).
NETWORKS = ("auto", "mlp", "cnn")
# The conv torso: MinAtar's own baseline agents' (Young and Tian 2019), one 3 x 3
# convolution of 16 channels, stride 1, unpadded, then a ReLU; its features, flattened in
# (H, W, channel) order, enter the MLP. Small enough to learn MinAtar on a few CPU cores
# (a 10 x 10 x 4 Breakout frame: 1,024 features from 37 k multiply-adds).
CONV_CHANNELS = (16,)
CONV_KERNEL = 3


class ActorCriticSettings(Protocol):
    """What the on-policy networks read of an algorithm's config (VPG's, PPO's)."""

    @property
    def hidden_sizes(self) -> Sequence[int]: ...
    @property
    def initial_log_std(self) -> float: ...
    @property
    def network(self) -> str: ...


class NetworkChoice(Protocol):
    """What picks the network of an algorithm that has ``algo.network``."""

    @property
    def network(self) -> str: ...


class TorsoSize(NamedTuple):
    """The conv torso on one image: its weights, its multiply-adds and the features it
    hands the MLP."""

    weights: int
    multiply_adds: int
    features: int


def fits_torso(image: Sequence[int]) -> bool:
    """Whether the torso's unpadded kernels fit in the image's height and width."""
    least = 1 + len(CONV_CHANNELS) * (CONV_KERNEL - 1)
    return min(image[:2]) >= least


def takes_torso(network: str, image: Sequence[int] | None) -> bool:
    """Whether observations of ``image`` shape (None: no image) go through the conv torso
    with ``algo.network=network``; the checks refuse ``cnn`` where they cannot."""
    return network == "cnn" or (network == "auto" and image is not None and fits_torso(image))


def torso_size(image: Sequence[int]) -> TorsoSize:
    """The torso's size on an (H, W, C) image."""
    height, width, channels = image
    weights = multiply_adds = 0
    for out_channels in CONV_CHANNELS:
        height, width = height - CONV_KERNEL + 1, width - CONV_KERNEL + 1
        kernel = CONV_KERNEL * CONV_KERNEL * channels * out_channels
        weights += kernel + out_channels
        multiply_adds += height * width * kernel
        channels = out_channels
    return TorsoSize(weights, multiply_adds, height * width * channels)
