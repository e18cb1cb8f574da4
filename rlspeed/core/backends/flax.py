"""``backend=flax`` (JAX + Flax + Optax)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from rlspeed.core.backends import BackendSpec, check_device, device_setting, gpu_index
from rlspeed.errors import ConfigError

if TYPE_CHECKING:
    import jax

    from rlspeed.config import BackendConfig


def _gpus() -> int:
    import jax

    try:
        return len(jax.devices("cuda"))
    except RuntimeError:  # no CUDA backend in this jax (a CPU install)
        return 0


def _set(option: str, value: object) -> None:
    """Set one of JAX's config options."""
    import jax

    jax.config.update(option, value)  # type: ignore[no-untyped-call]  # jax leaves it unannotated


def setup(cfg: BackendConfig, seed: int) -> None:
    device = device_setting(cfg)
    if device != "auto":
        import jax

        if device == "cpu":  # before JAX starts a backend: it then never touches a GPU
            _set("jax_platforms", "cpu")
        else:  # cuda or cuda:N (the config check has seen it)
            index = gpu_index(device) or 0
            _set("jax_default_device", jax.devices("cuda")[index])
    # JAX is seeded through explicit keys. Threads must be fixed before JAX starts its CPU
    # client: XLA sizes its thread pools from NPROC when set (else from the cores it may use).
    # auto was replaced by its number before any backend is set up (resolve_threads).
    assert isinstance(cfg.threads, int)
    if cfg.threads > 0:
        os.environ.setdefault("NPROC", str(cfg.threads))
        if "XLA_FLAGS" not in os.environ:
            os.environ["XLA_FLAGS"] = (
                f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={cfg.threads}"
            )
    if cfg.compilation_cache is not None:
        cache_dir = Path(cfg.compilation_cache).expanduser()
        _set("jax_compilation_cache_dir", str(cache_dir))
        # Every program, however quick to compile: a run compiles many small ones.
        _set("jax_persistent_cache_min_compile_time_secs", 0.0)


def lane_devices(cfg: BackendConfig) -> list[jax.Device]:
    """The devices a fused run's lanes spread over (``backend.devices``): all or the first N
    of JAX's local devices (of its default platform: ``backend.device=cpu`` makes them
    CPUs), or the one GPU ``backend.device=cuda:N`` names. A count above what JAX sees is
    refused in one line. JAX starts here if it has not: set up first, as the run sets it
    up (its platform and threads are fixed as it starts; ``setup`` reads no seed)."""
    import jax

    setup(cfg, 0)
    device = device_setting(cfg)
    index = gpu_index(device)
    found = (
        [jax.devices("cuda")[index]] if index is not None and ":" in device else jax.local_devices()
    )
    if cfg.devices == "all":
        return found
    assert isinstance(cfg.devices, int)  # checked: all or a count (check_devices)
    if cfg.devices > len(found):
        names = ", ".join(f"{d.platform}:{d.id}" for d in found)
        allowed = f"all, or a count in [1, {len(found)}] (the devices this run sees: {names})"
        raise ConfigError("backend.devices", cfg.devices, allowed)
    return found[: cfg.devices]


def device_name(cfg: BackendConfig) -> str:
    import jax

    # A config option that jax sets as an attribute at runtime (unknown to type checkers).
    device = jax.config.jax_default_device or jax.devices()[0]  # type: ignore[attr-defined]
    return f"{device.platform}:{device.id}"


def worker_gpus(cfg: BackendConfig) -> int:
    """The GPUs seed workers spread over: every GPU JAX sees for ``cuda``, the one that
    ``cuda:N`` names; none for ``cpu`` and ``auto`` (asking JAX would start it here, in the
    run's process, before its settings are made: name ``cuda`` to spread over the GPUs)."""
    device = device_setting(cfg)
    if gpu_index(device) is None:
        return 0
    return 1 if ":" in device else _gpus()


SPEC = BackendSpec(
    name="flax",
    setup=setup,
    check=lambda cfg: check_device(cfg, _gpus),
    device_name=device_name,
    worker_gpus=worker_gpus,
)
