"""Throughput of a fused (``backend=flax env=jax-vmap``) training program once compiled.

The whole-run figures of the CLI benchmarks include start-up, JIT compilation, logging
and evaluation; this times the same ``lax.scan`` program alone, in chunks, after a
warm-up. The chunk's statistics are returned and fetched as the CLI's loop fetches
them, so XLA cannot drop the work of recording episodes. It runs in a fresh process
that applies the backend's settings before JAX starts, as the CLI does
(``backend.threads`` sizes XLA's thread pools).

    python -m rlspeed.bench.compiled --budget-s 5 algo=dqn task=cartpole ...
"""

from __future__ import annotations

import argparse
import json
import math

from rlspeed.bench.common import calls_per_second, run_module


def measure(overrides: list[str], budget_s: float) -> float:
    """Env steps/s (over all ``num_seeds`` agents) of the fused program for ``overrides``
    in the CLI's chunks of ``log_every`` env steps, timed after the algorithm's
    ``learning_starts`` so that off-policy updates run. Call it before JAX computes
    anything in this process."""
    from rlspeed.bench.cli import compose_config
    from rlspeed.config_tree import register_configs
    from rlspeed.core.algos import import_named
    from rlspeed.registry import ALGOS, BACKENDS, TASKS
    from rlspeed.validation import check

    register_configs()
    # Checked as the CLI checks it (backend.threads=auto resolved).
    cfg = check(compose_config(["backend=flax", "env=jax-vmap", *overrides])).cfg
    BACKENDS.get(cfg.backend.name).setup(cfg.backend, cfg.seed)

    import jax

    from rlspeed.core.envs.vmap import make_vmap_env
    from rlspeed.seeding import jax_keys

    make_train = import_named(ALGOS.get(cfg.algo.name).fused)
    trainer = make_train(cfg, make_vmap_env(TASKS.get(cfg.task.name), cfg.task, cfg.num_envs))
    agents = cfg.num_seeds
    init, run = trainer.init, trainer.run
    if agents > 1:
        init, run = jax.vmap(init), jax.vmap(run, in_axes=(0, None, None))
    compiled_run = jax.jit(run, static_argnums=1)
    seeds = range(cfg.seed, cfg.seed + agents)
    state = jax.jit(init)(jax_keys(seeds if agents > 1 else cfg.seed))
    learning_starts = getattr(cfg.algo, "learning_starts", 0)
    if learning_starts:
        warm_up = math.ceil(learning_starts / trainer.steps_per_iteration)
        state, _ = compiled_run(state, warm_up, warm_up)
    iterations = max(1, math.ceil(cfg.log_every / trainer.steps_per_iteration))
    states = [state]

    def chunk() -> None:
        states[0], stats = compiled_run(states[0], iterations, iterations)
        jax.device_get(stats)

    chunks_per_s = calls_per_second(chunk, budget_s)
    return chunks_per_s * iterations * trainer.steps_per_iteration * agents


def compiled_env_steps_per_s(overrides: list[str], budget_s: float) -> float:
    """``measure`` in a fresh process (``overrides`` as for the CLI, flax + jax-vmap)."""
    stdout = run_module("rlspeed.bench.compiled", [f"--budget-s={budget_s}", *overrides])
    return float(json.loads(stdout.strip().splitlines()[-1])["env_steps_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlspeed.bench.compiled")
    parser.add_argument("--budget-s", type=float, default=5.0, help="seconds of timing")
    parser.add_argument("overrides", nargs="*", help="rlspeed config overrides")
    args = parser.parse_args()
    print(json.dumps({"env_steps_per_s": measure(args.overrides, args.budget_s)}))


if __name__ == "__main__":
    main()
