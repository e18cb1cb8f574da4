"""The networks the algorithms share, one module per backend, with the same layers, init and
parameter names on both (flax's ``Dense_i``, torch's ``net.<i>``), so weights carry over:
the MLP (DQN, TD3, PQN, the on-policy networks) and the on-policy actor-critic (VPG, PPO); for
torch also the init and optimizers every torch learner builds with."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

# Orthogonal init's gains (PPO's ``orthogonal_init``, CleanRL's and PureJaxRL's): hidden
# layers, the policy's output (near-uniform first actions), the value's output.
HIDDEN_GAIN, POLICY_GAIN, VALUE_GAIN = math.sqrt(2), 0.01, 1.0
# LayerNorm's epsilon on both backends (torch's default; flax's is 1e-6), so they agree.
LAYER_NORM_EPSILON = 1e-5


class ActorCriticSettings(Protocol):
    """What the on-policy networks read of an algorithm's config (VPG's, PPO's)."""

    @property
    def hidden_sizes(self) -> Sequence[int]: ...
    @property
    def initial_log_std(self) -> float: ...
