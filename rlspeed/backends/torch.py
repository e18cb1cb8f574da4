"""``backend=torch``."""

from __future__ import annotations

from typing import Any

from rlspeed.backends import BackendSpec


def setup(cfg: Any, seed: int) -> None:
    import torch

    from rlspeed.seeding import Stream, int_seed

    # torch's global generator draws the initial weights: the run's INIT stream.
    torch.manual_seed(int_seed(seed, Stream.INIT))
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


SPEC = BackendSpec(name="torch", setup=setup)
