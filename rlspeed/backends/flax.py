"""``backend=flax`` (JAX + Flax + Optax)."""

from __future__ import annotations

import os
from typing import Any

from rlspeed.backends import BackendSpec


def setup(cfg: Any, seed: int) -> None:
    # JAX is seeded through explicit keys. Threads must be fixed before JAX starts its CPU
    # client: XLA sizes its thread pools from NPROC when set (else from the cores it may use).
    if cfg.threads > 0:
        os.environ.setdefault("NPROC", str(cfg.threads))
        if "XLA_FLAGS" not in os.environ:
            os.environ["XLA_FLAGS"] = (
                f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={cfg.threads}"
            )


SPEC = BackendSpec(name="flax", setup=setup)
