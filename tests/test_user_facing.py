"""What a new user sees: --help, --version, the run's summary, its log file, its progress
and its learning curve, through the real ``rlspeed`` command."""

from __future__ import annotations

import csv
import datetime
import json
import os
import pty
import re
import struct
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from omegaconf import OmegaConf

from tests.conftest import (
    REPO_ROOT,
    RLSPEED,
    SMALL,
    cli_env,
    logged_rows,
    run_cli,
    saved_agent,
)

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
    assert set(groups) == {"algo", "backend", "env", "hparams", "preset", "task", "tracking"}
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


def test_cfg_job_prints_the_composed_config(tmp_path: Path) -> None:
    """Hydra's own flags work next to rlspeed's checks."""
    result = run_cli(["--cfg", "job", "backend=torch", "env=gym-sync"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: torch" in result.stdout and "name: gym-sync" in result.stdout
    # What the sweeper sets for its jobs is not the user's to set: it is left out.
    shown = yaml.safe_load(result.stdout)
    assert "trial" not in shown and "parent_run_id" not in shown["tracking"]
    assert shown["tracking"]["experiment"] == "rlspeed"
    assert list(tmp_path.iterdir()) == []
    resolved = run_cli(["--cfg", "job", "--resolve"], cwd=tmp_path)
    assert resolved.returncode == 0 and "${" not in resolved.stdout, resolved.stdout


@pytest.mark.slow
def test_multirun_grid_with_hydra_basic_sweeper(tmp_path):
    """`rlspeed -m backend=torch,flax ...` runs one job per combination."""
    args = ["-m", "backend=torch,flax", "env=gym-sync", "tracking=none", "progress=plain"]
    budget = ["total_steps=600", "log_every=300", "eval_every=600", "algo.learning_starts=200"]
    result = run_cli([*args, *budget, "num_envs=2", "algo.batch_size=16"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = sorted(p.name for p in (tmp_path / "outputs" / "multirun").glob("*/*/*") if p.is_dir())
    assert jobs == ["0_torch_gym-sync_dqn_doors", "1_flax_gym-sync_dqn_doors"]
    for job in (tmp_path / "outputs" / "multirun").glob("*/*/*_dqn_doors"):
        assert (job / "metrics.json").exists() and (job / "learning_curve.png").exists()


def _on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``rlspeed`` with a pseudo-terminal as its stdout and stderr: (exit code, output)."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [RLSPEED, *args],
        cwd=cwd,
        env=cli_env(),
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    output = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(primary)
    return process.wait(timeout=300), output.decode(errors="replace")


def _png_width(path: Path) -> int:
    return struct.unpack(">I", path.read_bytes()[16:20])[0]  # IHDR's width


# What a finished run leaves in its folder besides its checkpoint.
RUN_FILES = [
    ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "SHA256SUMS",
    "config.yaml", "learning_curve.png", "metrics.json", "resume.npz", "rlspeed.log",
]  # fmt: skip


def _check_run_folder(out: Path, checkpoint: str, total_steps: int) -> dict:
    """Every file a finished run leaves, each holding what a user reads in it; its metrics."""
    files = sorted(str(path.relative_to(out)) for path in out.rglob("*") if path.is_file())
    assert files == sorted([*RUN_FILES, checkpoint])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["env_steps"] == total_steps
    assert OmegaConf.load(out / "config.yaml").total_steps == total_steps
    assert (out / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    assert len(logged_rows(out)) == total_steps // OmegaConf.load(out / "config.yaml").log_every
    assert saved_agent(out)  # the checkpoint loads
    assert "rlspeed run" in (out / "rlspeed.log").read_text()
    return metrics


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_terminal_run_logs_progress_summary_compile_phase_and_eta(tmp_path: Path) -> None:
    """A fused run on a terminal: rich draws the bar (compiling, then training), and
    rlspeed.log still gets every progress line and the summary; the ETA leaves the compile
    time out; Doors' curve has the rolling step reward panel."""
    out = tmp_path / "run"
    code, screen = _on_a_terminal(
        [
            "backend=flax",
            "env=jax-vmap",
            "task=doors",
            "total_steps=8192",
            "log_every=1024",
            "eval_every=8192",
            "algo.learning_starts=500",
            "algo.hidden_sizes=[16]",
            "tracking=none",
            f"hydra.run.dir={out}",
        ],
        tmp_path,
    )
    assert code == 0, screen[-3000:]
    _check_run_folder(out, "checkpoint.msgpack", total_steps=8192)
    assert "compiling" in screen and "━" in screen  # the rich bar, in its compile phase
    log = (out / "rlspeed.log").read_text()
    assert "rlspeed: compiling the training program" in log
    assert "rlspeed: compiled the program and ran its first chunk in" in log
    progress = re.findall(
        r"^\[(\S+ \S+)\]\[rlspeed\]\[INFO\] - step ([\d,]+)/([\d,]+) \|.*\| eta (\S+)$",
        log,
        flags=re.MULTILINE,
    )
    assert len(progress) == 8, log
    # The first log comes after compiling: no rate to go by yet.
    assert progress[0][3] == "-"
    start = datetime.datetime.fromisoformat(progress[0][0].replace(",", "."))
    first_step = int(progress[0][1].replace(",", ""))
    for stamp, step, total, eta in progress[1:]:
        step, total = int(step.replace(",", "")), int(total.replace(",", ""))
        elapsed = (datetime.datetime.fromisoformat(stamp.replace(",", ".")) - start).total_seconds()
        expected = max(total - step, 0) * elapsed / (step - first_step)
        hours, minutes, seconds = map(int, eta.split(":"))
        assert abs(hours * 3600 + minutes * 60 + seconds - expected) <= 1.5, (eta, expected)
    # The summary, in the log file as on the terminal.
    for text in (screen, log):
        assert "rlspeed run" in text and "return, last 20 episodes" in text
        assert f"checkpoint  {out / 'checkpoint.msgpack'}" in text
    # Doors: episodic return, and rolling step reward beside the score (two panels).
    assert _png_width(out / "learning_curve.png") == 1100
    assert "| rolling step reward " in log and "rolling step reward  " in log


def _bar_states(screen: str) -> list[str]:
    """Each state the rich bar was drawn in, in order (escape codes taken out)."""
    states: list[str] = []
    for part in re.split(r"\r|\x1b\[2K|\x1b\[1A", screen):
        text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", part).strip()
        if "━" in text and text not in states:
            states.append(text)
    return states


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_host_bar_moves_between_logs_with_elapsed_time_and_a_saving_phase(
    tmp_path: Path,
) -> None:
    """A host-driven run that logs once, at its end: the bar still moves as it trains,
    shows the elapsed time, and says when it saves."""
    out = tmp_path / "run"
    code, screen = _on_a_terminal(
        [
            *(x for x in SMALL if not x.startswith("progress=")),
            "backend=torch",
            "env=gym-sync",
            "total_steps=6000",
            "log_every=6000",
            "eval_every=6000",
            "progress=rich",
            "tracking=none",
            f"hydra.run.dir={out}",
        ],
        tmp_path,
    )
    assert code == 0, screen[-3000:]
    states = _bar_states(screen)
    counts = {
        int(match[1].replace(",", ""))
        for state in states
        if state.startswith("training") and (match := re.search(r"([\d,]+)/6,000 steps", state))
    }
    assert len(counts - {0, 6000}) >= 2, states  # moved between the start and the only log
    assert all(re.search(r"\d+:\d\d:\d\d$", state) for state in states), states  # elapsed
    assert any(state.startswith("saving") for state in states), states
    assert "rlspeed: saving the checkpoint" in (out / "rlspeed.log").read_text()


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_summary_shows_full_paths_and_how_to_open_the_run(tmp_path: Path) -> None:
    """Paths longer than the console are printed whole; a SQLite store gets the `mlflow ui`
    command and the run's page there; GridWorld's curve and lines show no rolling step reward."""
    out = tmp_path / ("a-folder-name-long-enough-to-pass-any-console-width-" * 2) / "run"
    db = tmp_path / "mlflow.db"
    result = run_cli(
        [
            "backend=torch",
            "env=gym-sync",
            "task=gridworld",
            "total_steps=2000",
            "log_every=500",
            "eval_every=1000",
            "algo.learning_starts=200",
            "algo.hidden_sizes=[16]",
            "progress=plain",
            "tracking.uri=sqlite:///mlflow.db",
            f"hydra.run.dir={out}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    run_id = _check_run_folder(out, "checkpoint.pt", total_steps=2000)["mlflow_run_id"]
    client = MlflowClient(f"sqlite:///{db}")
    artifacts = sorted(artifact.path for artifact in client.list_artifacts(run_id))
    assert artifacts == ["checkpoint.pt", "config.yaml", "learning_curve.png", "metrics.json"]
    experiment = client.get_run(run_id).info.experiment_id
    lines = result.stdout.splitlines()
    # backend.device=auto on a machine where torch sees no GPU: the summary says so.
    assert any(line.split() == ["│", "device", "│", "cpu", "│"] for line in lines), lines
    page = f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{run_id}"
    assert lines[-5:] == [
        f"outputs        {out}",
        f"checkpoint     {out / 'checkpoint.pt'}",
        f"MLflow run id  {run_id}",
        f"MLflow UI      mlflow ui --backend-store-uri sqlite:///{db}",
        f"MLflow run     {page}?workflowType=machine_learning (with mlflow ui)",
    ]
    assert "…" not in result.stdout
    # A new store's first run: MLflow creates its tables and the experiment without a word
    # (its INFO lines came first); rlspeed's own line opens the output.
    assert not re.search(r" INFO mlflow[.\w]*: ", result.stderr + result.stdout), result.stderr
    assert "[rlspeed][INFO] - " in lines[0], lines[0]
    # GridWorld's score is a mean return: one panel, returns and score together; its
    # progress lines and summary show the last episodes' return, not a step reward.
    assert _png_width(out / "learning_curve.png") == 550
    assert "rolling step reward" not in result.stdout
    assert re.search(r"\| last-20 return -?\d+\.\d\d \| score", result.stdout), result.stdout


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_a_grid_of_stacks_ends_with_its_jobs_side_by_side(tmp_path: Path) -> None:
    """The SPEC's stack grid (Hydra's basic sweeper) ends with one comparison: printed, and
    as comparison.{csv,md,png} in the sweep folder, a row per job with its own numbers."""
    grid = ["-m", "backend=torch,flax", "env=gym-sync,jax-vmap", "task=gridworld", "algo=qlearn"]
    result = run_cli([*grid, "total_steps=2000", "tracking=none", "progress=none"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "jobs side by side" in result.stdout
    (sweep_dir,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    with (sweep_dir / "comparison.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    stacks = [(row["backend"], row["env"]) for row in rows]
    assert stacks == [("torch", "gym-sync"), ("torch", "jax-vmap"), ("flax", "gym-sync"),
                      ("flax", "jax-vmap")]  # fmt: skip
    for row in rows:
        (job_dir,) = sweep_dir.glob(f"{row['job']}_*")
        metrics = json.loads((job_dir / "metrics.json").read_text())
        assert float(row["env_steps_per_s"]) == pytest.approx(metrics["env_steps_per_s"])
        assert float(row["score"]) == metrics["score"] and row["status"] == "FINISHED"
        assert row["overrides"] == f"backend={row['backend']} env={row['env']}"
    assert (sweep_dir / "comparison.png").stat().st_size > 0
    assert (
        "| 3 | flax | jax-vmap | qlearn | gridworld |" in (sweep_dir / "comparison.md").read_text()
    )
