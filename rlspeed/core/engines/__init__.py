"""Environment engines: how many copies of a task are stepped, and where.

Every engine returns the same ``StepResult``; episode statistics are computed by the
engine itself (in NumPy for Gymnasium, inside JAX for jax-vmap), so the algorithms and
the metrics code never care which engine runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from rlspeed.core import AnyArray


class StepResult(NamedTuple):
    obs: Any  # next observations, already auto-reset where an episode ended
    reward: Any
    terminated: Any
    truncated: Any
    final_obs: Any  # true next observations: the episode's last one where it ended
    episode_return: Any  # return / length of the episode that ended (where done)
    episode_length: Any


class Engine(Protocol):
    num_envs: int
    single_observation_space: Any
    single_action_space: Any

    def reset(self) -> Any: ...

    # ``actions``: a batch, one per env, of whatever library the learner acts with.
    def step(self, actions: AnyArray) -> StepResult: ...

    def close(self) -> None: ...

    # What a resume continues from (the envs' state, the episodes so far), as a tree the
    # resume file holds (``rlspeed.checkpoint``); loaded into an engine just reset.
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class EngineSpec:
    name: str
    # True when the engine needs the task's functional JAX twin.
    needs_functional_env: bool
    # (task spec, task config, engine config, num_envs, seed) -> Engine
    make: Callable[[Any, Any, Any, int, int], Engine]
    # The most envs this machine can run on the engine (None: num_envs' memory check alone).
    max_envs: Callable[[], int] | None = None
