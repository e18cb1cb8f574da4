"""rlspeed's core as a library: PPO on CartPole as one fused JAX program, with no command line,
no config files, no tracking. The training loop yields a chunk per compiled call; this file
is the driver (``rlspeed.run`` is the tool's): it prints each chunk's numbers and keeps the
chunk, then scores the agent and saves it.

    python examples/core_library.py [--total-steps 102400] [--seeds 1] [--out ppo.msgpack]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from rlspeed.checkpoint import save_pytree
from rlspeed.config import BackendConfig, EngineConfig, RunConfig
from rlspeed.core.algos import import_named
from rlspeed.core.algos.loops.fused_training import FusedTraining
from rlspeed.core.algos.ppo import PPOConfig
from rlspeed.core.tasks.cartpole import CartPoleTaskConfig
from rlspeed.registry import ALGOS, BACKENDS, TASKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=102_400)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("ppo_cartpole.msgpack"))
    args = parser.parse_args()

    # The run as the schemas' dataclasses: what `rlspeed algo=ppo task=cartpole` composes.
    cfg = RunConfig(
        backend=BackendConfig(name="flax", threads=0),
        env=EngineConfig(name="jax-vmap"),
        algo=PPOConfig(
            num_steps=32,
            gamma=0.98,
            gae_lambda=0.8,
            learning_rate=1e-3,
            update_epochs=20,
            num_minibatches=1,
            ent_coef=0.0,
        ),
        task=CartPoleTaskConfig(),
        num_envs=8,
        num_seeds=args.seeds,
        total_steps=args.total_steps,
        log_every=10_240,
    )
    task = TASKS.get("cartpole")
    BACKENDS.get("flax").setup(cfg.backend, cfg.seed)
    make_train = import_named(ALGOS.get("ppo").fused)
    training = FusedTraining([cfg], task, make_train)

    for chunk in training.chunks():
        (run,) = chunk.runs.values()
        ended = run.done.astype(bool)
        returns = run.episode_return[ended]
        mean = f"{returns.mean():7.1f}" if returns.size else "      -"
        print(f"step {int(run.steps.max()):>7,}  episodes {ended.sum():>5}  mean return {mean}")
        training.accept(0)  # this chunk's agents are the ones kept

    result = training.result(0)
    policies = training.policies(0)  # one per seed
    scores = [task.evaluate(cfg.task, p, cfg.seed + i) for i, p in enumerate(policies)]
    print(f"{result.steps:,} env steps, {result.updates:,} updates; score {np.mean(scores):.1f}")
    save_pytree(training.agents(0), args.out)
    print(f"saved {args.out}")
    shell = {"hydra", "omegaconf", "mlflow", "optuna"}
    loaded = sorted({m.split(".")[0] for m in sys.modules} & shell)
    print(f"shell libraries loaded: {loaded or 'none'}")


if __name__ == "__main__":
    main()
