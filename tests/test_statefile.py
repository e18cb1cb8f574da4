"""The resume state's file format: everything training state is made of reads back as the
same value of the same type, and nothing else is written or read."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlspeed import statefile


def _round_trip(tree: Any, path: Path) -> Any:
    with open(path, "wb") as file:
        statefile.dump(tree, file)
    return statefile.load(path)


def _same(a: Any, b: Any) -> None:
    """Equal values of the same types all the way down (arrays: dtype, shape and bits)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(key, next(k for k in b if k == key))
            _same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray | np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes() and np.shape(a) == np.shape(b)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


def test_training_state_reads_back_exactly(tmp_path):
    network = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(network.parameters(), betas=(0.8, 0.99))
    network(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    rng = np.random.default_rng(7)
    tree = {
        "ints": [0, -1, 2**200, True, False, None],
        "floats": (0.1, -0.0, math.inf, -math.inf, math.nan, 1e-310),
        "text": "é \u2603 $tuple",
        "$not a tag": {"$array": 1},
        7: {(1, "a"): [np.float32(0.5), np.int64(-3), np.bool_(True)]},
        "arrays": [np.arange(6, dtype=np.uint8).reshape(2, 3), np.array(2.5), np.zeros((0, 4))],
        "numpy generator": rng.bit_generator.state,  # PCG64's ints exceed 64 bits
        "torch generator": torch.Generator().manual_seed(3).get_state(),
        "network": network.state_dict(),
        "optimizer": optimizer.state_dict(),  # int keys, tuples, tensors
        "window": [(1.5, 3), (float("nan"), 0)],
    }
    saved = _round_trip(tree, tmp_path / "state.npz")
    _same({**tree, "network": dict(tree["network"])}, saved)
    assert saved["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.99)
    rng.bit_generator.state = saved["numpy generator"]  # as a resumed run puts it back
    assert rng.integers(1 << 62) == np.random.default_rng(7).integers(1 << 62)
    optimizer.load_state_dict(saved["optimizer"])
    torch.Generator().set_state(saved["torch generator"])


@pytest.mark.parametrize("value", [{1, 2}, object(), np.array([None], dtype=object)])
def test_what_could_not_read_back_exactly_is_not_written(value, tmp_path):
    with pytest.raises((TypeError, ValueError)), open(tmp_path / "state.npz", "wb") as file:
        statefile.dump({"value": value}, file)
