"""``backend=torch``."""

from __future__ import annotations

from typing import Any

from rlspeed.backends import BackendSpec


def setup(cfg: Any, seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


SPEC = BackendSpec(name="torch", setup=setup)
