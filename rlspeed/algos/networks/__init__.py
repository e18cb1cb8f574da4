"""The networks the algorithms share, one module per backend, with the same layers, init and
parameter names on both (flax's ``Dense_i``, torch's ``net.<i>``), so weights carry over:
the MLP (DQN, TD3, the on-policy networks) and the on-policy actor-critic (VPG, PPO); for
torch also the init and optimizers every torch learner builds with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class ActorCriticSettings(Protocol):
    """What the on-policy networks read of an algorithm's config (VPG's, PPO's)."""

    @property
    def hidden_sizes(self) -> Sequence[int]: ...
    @property
    def initial_log_std(self) -> float: ...
