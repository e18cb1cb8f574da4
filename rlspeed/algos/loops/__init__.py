"""The training loops, and the one place that picks which one trains a run.

``backend=flax env=jax-vmap`` runs the algorithm's fused program (``fused.py``): acting,
stepping, storing and learning inside one jitted function, vmapped over seeds. Every other
pairing drives the algorithm's learner from Python, one seed after another:
``train_host`` (``host.py``) runs the learner's own iterations. A learner is built after the
engine exists, so AsyncVectorEnv forks its workers before the backend starts threads of its
own.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from rlspeed.algos import import_named
from rlspeed.config import is_fused
from rlspeed.registry import ALGOS

if TYPE_CHECKING:
    from rlspeed.context import RunContext, TrainResult

# The agent's file in the run folder, by backend (``mode=eval`` loads it).
CHECKPOINT_FILES = {"torch": "checkpoint.pt", "flax": "checkpoint.msgpack"}


def train(ctx: RunContext) -> TrainResult:
    """Train the run's ``num_seeds`` agents with the loop its algorithm, backend and engine
    call for."""
    cfg = ctx.cfg
    spec = ALGOS.get(cfg.algo.name)
    if is_fused(cfg):
        from rlspeed.algos.loops.fused import train_fused

        return train_fused(ctx, import_named(spec.fused))
    from rlspeed.algos.loops.host import train_host

    learner = import_named(spec.learners[cfg.backend.name])
    checkpoint = CHECKPOINT_FILES[cfg.backend.name]
    return ctx.each_seed(
        lambda seed_ctx: train_host(
            seed_ctx, partial(learner, cfg=cfg, seed=seed_ctx.seed), checkpoint
        )
    )


def train_runs(ctxs: list[RunContext]) -> list[TrainResult | Exception]:
    """Train fused runs that differ only in traced hyperparameters (a sweep's trials) as one
    program; each run's result, or the exception that ended it (``train_fused_runs``)."""
    from rlspeed.algos.loops.fused import train_fused_runs

    return train_fused_runs(ctxs, import_named(ALGOS.get(ctxs[0].cfg.algo.name).fused))
