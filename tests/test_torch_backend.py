"""backend=torch's set-up: deterministic kernels without loading torch.compile's stack."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT, cli_env

SETUP = """
import sys
import torch
from rlspeed.config import BackendConfig
from rlspeed.core.backends.torch import setup
setup(BackendConfig(name="torch", threads=1, deterministic={deterministic}), seed=1)
print(torch.are_deterministic_algorithms_enabled(), "torch._inductor" in sys.modules)
"""


def _set_up(deterministic: bool) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SETUP.format(deterministic=deterministic)],
        cwd=REPO_ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_deterministic_kernels_are_on_and_inductor_is_not_imported():
    """torch.use_deterministic_algorithms imports inductor (~800 modules, ~1 s a run) for a
    compiler rlspeed never calls; the eager switch alone is what a run needs."""
    assert _set_up(True) == "True False"
    assert _set_up(False) == "False False"
