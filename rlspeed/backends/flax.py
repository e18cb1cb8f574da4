"""``backend=flax`` (JAX + Flax + Optax)."""

from __future__ import annotations

import os
from pathlib import Path
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
    if cfg.compilation_cache is not None:
        import jax

        cache_dir = Path(cfg.compilation_cache).expanduser()
        jax.config.update("jax_compilation_cache_dir", str(cache_dir))
        # Every program, however quick to compile: a run compiles many small ones.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


SPEC = BackendSpec(name="flax", setup=setup)
