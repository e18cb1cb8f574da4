"""``mjx``: HalfCheetah's env steps/s against ``num_envs``, MuJoCo against MJX.

The ``envs`` benchmark's four modes on ``task=halfcheetah``: ``gym-sync`` and ``gym-async``
step Gymnasium's ``HalfCheetah-v5`` (MuJoCo, float64, in C); ``jax-vmap`` and ``jax-fused``
step its MJX twin (float32, compiled by XLA), called from Python or inside one ``lax.scan``.
Random actions within the action box, no learning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, write_results
from rlspeed.bench.envs import ASYNC_MAX_ENVS, COLUMNS, MODES, plot_rates, rates_table


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    # Quick: one width, as each width compiles MJX's step twice (~15 s each on 2 cores).
    env_counts = (8,) if quick else (1, 8, 64, 256)
    budget_s = 0.05 if quick else 3.0
    table = Table(
        "mjx",
        "HalfCheetah env steps/s against num_envs: MuJoCo (gym-*) against MJX (jax-*)",
        COLUMNS,
        notes=[
            f"gym-async runs one process per env and stops at {ASYNC_MAX_ENVS} envs.",
            "jax-fused: the vmapped MJX step inside one jitted lax.scan (compile time"
            " excluded); jax-vmap: the same step jitted, called once per vector step.",
            "One env step is 5 MuJoCo steps (frame_skip 5) of Gymnasium's half_cheetah.xml"
            " with its default solver (Newton, up to 100 iterations).",
            "x_gym_sync: env steps/s divided by gym-sync's at the same num_envs.",
            f"Each figure: at least {budget_s} s of stepping after one warm-up call.",
        ],
    )
    rates_table(
        table, compose, MODES, env_counts, budget_s, {"gym-async": ASYNC_MAX_ENVS}, ("halfcheetah",)
    )
    return write_results(table, out_dir, plot_rates)
