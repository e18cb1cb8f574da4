"""Checkpoint resume and ``mode=eval`` through the real CLI.

A run cut by SIGTERM and resumed with ``resume=<its folder>`` must end where the same run
uninterrupted ends: same parameters, same score and counters. The cut lands wherever the
signal finds the run (after its first progress line); the loops hold the signal until the
end of the iteration, so the checkpoint holds a whole one wherever that is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import mlflow
import pytest

from rlspeed.checkpoint import deferred_interrupts
from rlspeed.errors import ConfigError
from tests.conftest import (
    assert_one_line_error,
    logged_rows,
    run_cli,
    saved_agent,
    slow_but,
    start_cli,
)

# Tiny DQN runs on GridWorld (one-hot of 25 cells): a few seconds each.
DQN = [
    "algo=dqn",
    "task=gridworld",
    "algo.hidden_sizes=[16]",
    "algo.learning_starts=200",
    "algo.buffer_size=1000",
    "algo.batch_size=32",
    "algo.target_network_frequency=200",
    "tracking=none",
    "progress=plain",
]
PATHS = {
    "torch-gym-sync": ["backend=torch", "env=gym-sync", "num_envs=4", "total_steps=3000"],
    # Every chunk logs and evaluates, so the run lasts well past its first progress line.
    "flax-jax-vmap": ["backend=flax", "env=jax-vmap", "num_envs=8", "total_steps=24000"],
}
LOGS = ["log_every=400", "eval_every=400"]
# What must match exactly (wall-time rates aside).
SAME = ("score", "rolling_step_reward", "recent_return", "env_steps", "gradient_updates")


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def _cut_after_first_log(args: list[str], cwd: Path) -> str:
    """Start the CLI, SIGTERM it once its first progress line appears; returns its output."""
    with start_cli(args, cwd, stderr=subprocess.STDOUT) as proc:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if " - step " in line:
                proc.send_signal(signal.SIGTERM)
                break
        lines += proc.stdout.readlines()
        proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines)
    return "".join(lines)


@pytest.mark.parametrize("path", slow_but("flax-jax-vmap", list(PATHS)))
def test_sigterm_then_resume_ends_like_an_uninterrupted_run(tmp_path, path):
    args = [*DQN, *PATHS[path], *LOGS]
    whole = run_cli([*args, "hydra.run.dir=whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    output = _cut_after_first_log([*args, "hydra.run.dir=cut"], tmp_path)
    cut = _metrics(tmp_path / "cut")
    assert cut["status"] == "KILLED", output[-2000:]
    total = int(PATHS[path][-1].partition("=")[2])
    assert 0 < cut["env_steps"] < total, "the run ended before the signal: lengthen it"

    # Another config cannot continue it.
    other = run_cli([*args, "total_steps=9000", "resume=cut", "hydra.run.dir=other"], tmp_path)
    assert_one_line_error(
        other,
        f"rlspeed: invalid resume=cut: expected a run of this config (it ran with "
        f"total_steps={total}, this run has total_steps=9000)",
    )
    assert other.returncode == 2 and not (tmp_path / "other").exists()

    # Tracking may change on resume: one path records the resumed run in MLflow.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = ["tracking=mlflow", f"tracking.uri={uri}"] if path == "torch-gym-sync" else []
    resumed = run_cli([*args, *tracking, "resume=cut", "hydra.run.dir=resumed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    if tracking:
        client = mlflow.tracking.MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("rlspeed").experiment_id])
        assert run.info.status == "FINISHED"
        assert run.data.tags["rlspeed.resumed_from"] == str((tmp_path / "cut").resolve())
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "charts/SPS")]
        assert steps[0] > cut["env_steps"] and steps[-1] == total
    # Progress goes on from the saved step, not from 0.
    first = next(line for line in resumed.stdout.splitlines() if " - step " in line)
    assert int(first.split(" - step ")[1].split("/")[0].replace(",", "")) > cut["env_steps"]
    a, b = _metrics(tmp_path / "whole"), _metrics(tmp_path / "resumed")
    assert b["status"] == "FINISHED"
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    assert saved_agent(tmp_path / "whole") == saved_agent(tmp_path / "resumed")
    # Every logged row alike, the one after the cut too (its interval spans both runs).
    assert logged_rows(tmp_path / "whole") == logged_rows(tmp_path / "resumed")

    # mode=eval scores the saved agent as training's final evaluation did, and films it.
    evaluated = run_cli(
        ["mode=eval", "checkpoint=resumed", "video=episode.gif", "hydra.run.dir=eval"], tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert f"rlspeed: score {a['score']:.4f}" in evaluated.stdout
    assert (tmp_path / "episode.gif").stat().st_size > 0


def test_a_signal_waits_for_the_end_of_the_iteration():
    """The loops' guard: SIGTERM is handed to the run's handler at ``check()``, a second
    one at once, and the handler is back in place after the block."""

    def handler(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"), deferred_interrupts() as check:
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("rest of the iteration")
            check()
            reached.append("next iteration")
        assert reached == ["rest of the iteration"]
        with pytest.raises(KeyboardInterrupt), deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after a second signal")
        assert reached == ["rest of the iteration"]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_resume_may_change_the_thread_count_but_not_what_it_trains(tmp_path, make_cfg):
    """A run saved with one thread count (another machine, or before threads=auto chose
    one) resumes with any other; a key that changes training still refuses it."""
    from omegaconf import OmegaConf

    from rlspeed.checkpoint import check_resume

    (tmp_path / "resume.pkl").write_bytes(b"")
    OmegaConf.save(make_cfg(["backend.threads=0"]), tmp_path / "config.yaml")
    check_resume(make_cfg(["backend.threads=1", f"resume={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"it ran with total_steps=\d+, this run has"):
        check_resume(make_cfg(["total_steps=123", f"resume={tmp_path}"]))


class _MakesFolder:
    """A pickle that creates a folder when it is read: what a hostile file could run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (str(self.path),))


def test_resume_reads_only_the_files_its_run_writes(tmp_path, make_cfg, monkeypatch):
    """A one-seed run's resume reads its resume.pkl alone: a resume_seed7.pkl dropped into
    the folder is never unpickled (it would have run code)."""
    import pickle

    from rlspeed.run import run

    quick = ["algo=qlearn", "task=gridworld", "backend=torch", "env=gym-sync", "num_envs=2"]
    quick += ["total_steps=200", "log_every=100", "eval_every=200", "tracking=none"]
    quick += ["progress=none"]
    first, marker = tmp_path / "first", tmp_path / "code-ran"
    first.mkdir()
    monkeypatch.chdir(first)
    run(make_cfg(quick))
    (folder,) = {path.parent for path in first.rglob("resume.pkl")}
    (folder / "resume_seed7.pkl").write_bytes(pickle.dumps(_MakesFolder(marker)))
    (tmp_path / "again").mkdir()
    monkeypatch.chdir(tmp_path / "again")
    run(make_cfg([*quick, f"resume={folder}"]))
    assert not marker.exists(), "a file the run did not write was unpickled"
    assert list((tmp_path / "again").rglob("metrics.json"))
