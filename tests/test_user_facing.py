"""What a new user sees: --help, --version, the run's summary, its log file, its progress
and its learning curve, through the real ``rlspeed`` command."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from tests.conftest import REPO_ROOT, cli_env, run_cli

SPEC_COMMANDS = (
    "rlspeed backend=flax env=jax-vmap num_envs=384",
    "rlspeed backend=torch env=gym-sync algo=dqn task=doors",
    "rlspeed -m backend=torch,flax env=gym-sync,gym-async,jax-vmap",
    "rlspeed -m hparams=dqn_search hydra/sweeper=optuna",
    "rlspeed -m hparams=dqn_search hydra/sweeper=optuna hydra/launcher=joblib",
)


def test_help_describes_rlspeed_with_examples_and_user_groups(tmp_path: Path) -> None:
    result = run_cli(["--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("rlspeed: train model-free reinforcement-learning agents")
    for command in SPEC_COMMANDS:
        assert command in text
    groups = dict(re.findall(r"^  ([\w/]+): (.+)$", text, flags=re.MULTILINE))
    assert groups["algo"].split(", ")[0] == "dqn"
    assert "jax-vmap" in groups["env"] and "mlflow" in groups["tracking"]
    assert set(groups) == {"algo", "backend", "env", "hparams", "task", "tracking"}
    # The internals: typed schemas, per-pair defaults, an Optuna trial's keys.
    for internal in ("schema/", "algo_task", "trial:", "Powered by Hydra"):
        assert internal not in text


def test_version_prints_the_installed_version_without_loading_hydra(tmp_path: Path) -> None:
    result = run_cli(["--version"], cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"rlspeed {version('rlspeed')}\n",
        "",
    )
    # Instant: nothing heavy is imported to print it.
    probe = (
        "import sys\n"
        "from rlspeed.cli import main\n"
        "sys.argv = ['rlspeed', '--version']\n"
        "try:\n    main()\n"
        "except SystemExit:\n"
        "    print(sorted({'hydra', 'jax', 'torch', 'numpy'} & set(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, env=cli_env(), capture_output=True, text=True
    )
    assert loaded.stdout.splitlines()[-1] == "[]", loaded.stdout + loaded.stderr
