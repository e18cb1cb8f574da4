"""Step arithmetic shared by the host loops (Python numbers) and jitted ones
(``xp=jax.numpy``): ``xp`` is the array namespace of traced or batched steps, None for
Python numbers (the config checks count updates with it, before NumPy is loaded)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from types import ModuleType

    import jax

    # An env step or a count of them: a Python int, or a traced JAX one.
    Steps = int | jax.Array


def multiples_between(
    prev: Steps, step: Steps, every: int, start: int, xp: ModuleType | None = None
) -> Any:
    """How many multiples of ``every`` lie in ``(max(prev, start), step]``.

    Env steps advance ``num_envs`` at a time; counting the multiples crossed makes
    "one update every k env steps" mean the same thing for any ``num_envs``.
    """
    maximum = max if xp is None else xp.maximum
    return maximum(step // every - maximum(prev, start) // every, 0)


def steps_run(total_steps: int, num_envs: int) -> int:
    """Env steps a loop of whole ``num_envs``-step iterations takes to reach ``total_steps``
    (``total_steps`` rounded up to a multiple of ``num_envs``)."""
    return -(-total_steps // num_envs) * num_envs


def updates_in_run(total_steps: int, num_envs: int, every: int, start: int) -> int:
    """Gradient updates a run does at one every ``every`` env steps after ``start``: its loop
    takes whole iterations of ``num_envs`` env steps (``steps_run``)."""
    return int(multiples_between(0, steps_run(total_steps, num_envs), every, start))


def polyak_weight(tau: float, crossings: Steps) -> Any:
    """Weight of ``crossings`` Polyak steps of ``tau`` toward the same online parameters,
    taken as one step ``target += w * (online - target)``: ``w = 1 - (1 - tau) ** k``
    (1 for ``tau = 1``: a copy). One iteration of ``num_envs`` env steps may cross several
    target syncs, and the online parameters do not change between them."""
    return 1.0 - (1.0 - tau) ** crossings


def linear_schedule(
    step: Steps, start: float, end: float, duration: float, xp: ModuleType | None = None
) -> Any:
    """``start`` at step 0, linearly to ``end`` at ``duration``, then ``end``."""
    minimum, maximum = (min, max) if xp is None else (xp.minimum, xp.maximum)
    # ``duration`` may be traced (a fused run's hyperparameters are inputs of its program).
    return start + (end - start) * minimum(step / maximum(duration, 1.0), 1.0)


class Exploration(Protocol):
    """What ``epsilon_at`` reads of an algorithm's config (DQN's, tabular Q-learning's)."""

    @property
    def start_e(self) -> float: ...
    @property
    def end_e(self) -> float: ...
    @property
    def exploration_fraction(self) -> float: ...


def epsilon_at(
    step: Steps, algo: Exploration, total_steps: int, xp: ModuleType | None = None
) -> Any:
    """Exploration rate at env ``step``: ``algo.start_e`` linearly to ``algo.end_e`` over
    ``algo.exploration_fraction`` of the run (DQN and tabular Q-learning)."""
    duration = algo.exploration_fraction * total_steps
    return linear_schedule(step, algo.start_e, algo.end_e, duration, xp)
