"""``backend=torch``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rlspeed.core.backends import BackendSpec, check_device, device_setting

if TYPE_CHECKING:
    import torch

    from rlspeed.config import BackendConfig


def device_of(cfg: BackendConfig) -> torch.device:
    """``backend.device`` as a torch device (auto: the first GPU torch sees, else the CPU)."""
    import torch

    device = device_setting(cfg)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def setup(cfg: BackendConfig, seed: int) -> None:
    import torch

    from rlspeed.seeding import Stream, int_seed

    if device_of(cfg).type == "cuda":
        # cuBLAS is deterministic only with a fixed workspace; set before CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    # torch's global generator draws the initial weights: the run's INIT stream.
    torch.manual_seed(int_seed(seed, Stream.INIT))
    # auto was replaced by its number before any backend is set up (resolve_threads).
    assert isinstance(cfg.threads, int)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:
        _deterministic_eager_ops()
        torch.backends.cudnn.benchmark = False


def _deterministic_eager_ops() -> None:
    """``torch.use_deterministic_algorithms(True)`` for the eager ops rlspeed runs. The public
    call also sets torch.compile's (inductor's) flag, importing inductor, dynamo and sympy
    (~800 modules, ~150 MB and a second of start-up) for a compiler rlspeed never calls;
    the eager switch it makes is set here alone where this torch has it."""
    import torch

    set_eager = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_eager is None:
        torch.use_deterministic_algorithms(True)
    else:
        set_eager(True)


def worker_gpus(cfg: BackendConfig) -> int:
    """The GPUs seed workers spread over: every GPU torch sees where the agent goes to
    ``cuda`` (or ``auto`` finds one), the one that ``cuda:N`` names, none on the CPU."""
    device = device_of(cfg)
    if device.type != "cuda":
        return 0
    return 1 if device.index is not None else _gpus()


SPEC = BackendSpec(
    name="torch",
    setup=setup,
    check=lambda cfg: check_device(cfg, _gpus),
    device_name=lambda cfg: str(device_of(cfg)),
    worker_gpus=worker_gpus,
)
