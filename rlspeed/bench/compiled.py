"""Throughput of a fused (``backend=flax env=jax-vmap``) training program once compiled.

The whole-run figures of the CLI benchmarks include start-up, JIT compilation, logging
and evaluation; this times the same ``lax.scan`` program alone, in chunks, after a
warm-up. The chunk's statistics are returned and fetched as the CLI's loop fetches
them, so XLA cannot drop the work of recording episodes.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import jax

from rlspeed.bench.common import calls_per_second
from rlspeed.engines.jax_vmap import make_vmap_env
from rlspeed.registry import ALGOS, TASKS


def compiled_env_steps_per_s(overrides: list[str], compose: Any, budget_s: float) -> float:
    """Env steps/s (over all ``num_seeds`` agents) of the fused program for ``overrides``
    in the CLI's chunks of ``log_every`` env steps, timed after the algorithm's
    ``learning_starts`` so that off-policy updates run."""
    cfg = compose(overrides)
    module_name = ALGOS.get(cfg.algo.name).implementations["flax"].partition(":")[0]
    make_train = importlib.import_module(module_name).make_train
    trainer = make_train(cfg, make_vmap_env(TASKS.get(cfg.task.name), cfg.task, cfg.num_envs))
    agents = cfg.num_seeds
    init, run = trainer.init, trainer.run
    if agents > 1:
        init, run = jax.vmap(init), jax.vmap(run, in_axes=(0, None))
    compiled_run = jax.jit(run, static_argnums=1)
    state = jax.jit(init)(
        jax.random.split(jax.random.key(cfg.seed), agents)
        if agents > 1
        else jax.random.key(cfg.seed)
    )
    learning_starts = cfg.algo.get("learning_starts", 0)
    if learning_starts:
        state, _ = compiled_run(state, math.ceil(learning_starts / trainer.steps_per_iteration))
    iterations = max(1, math.ceil(cfg.log_every / trainer.steps_per_iteration))
    states = [state]

    def chunk() -> None:
        states[0], stats = compiled_run(states[0], iterations)
        jax.device_get(stats)

    chunks_per_s = calls_per_second(chunk, budget_s)
    return chunks_per_s * iterations * trainer.steps_per_iteration * agents
