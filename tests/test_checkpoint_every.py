"""Periodic checkpoints (``checkpoint_every``) through the real CLI: a run killed outright
(SIGKILL: no handler runs, nothing is written on the way out) resumes from its last periodic
checkpoint and ends where the same run uninterrupted ends."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from rlspeed import recording, statefile
from rlspeed.recording import CheckpointSchedule
from tests.conftest import run_cli, saved_agent, start_cli, without_rates
from tests.test_resume import DQN, LOGS, PATHS, SAME

EVERY = 800
SYNC, ASYNC, FUSED = (
    [a for a in PATHS[path] if "total_steps" not in a]
    for path in ("torch-gym-sync", "torch-gym-async", "flax-jax-vmap")
)
# (arguments, total steps, seeds, the resume file whose appearance means a periodic checkpoint)
CASES = {
    "torch-gym-sync": (SYNC, 12000, 1, "resume.npz"),
    # The envs' state is taken in their worker processes, which SIGKILL does not reach.
    "torch-gym-async": (ASYNC, 12000, 1, "resume.npz"),
    # Killed during seed 1: seed 0's files hold its whole run, seed 1's its last checkpoint.
    "torch-gym-sync-2-seeds": ([*SYNC, "num_seeds=2"], 6000, 2, "resume_seed1.npz"),
    # Written at chunk ends (400 env steps: log_every); 8 envs.
    "flax-jax-vmap": (FUSED, 24000, 1, "resume.npz"),
}


def _kill_after_checkpoint(args: list[str], cwd: Path, folder: Path, resume_file: str) -> None:
    """Start the CLI and SIGKILL it as soon as ``resume_file`` appears in ``folder`` (it is
    renamed into place whole), before the run ends."""
    with start_cli(args, cwd, stdout=None, stderr=None) as proc:
        while not (folder / resume_file).exists() and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before its first checkpoint"


def _rows(folder: Path) -> list[list[dict[str, float]]]:
    """Every row the run logged, and each seed's, rates aside."""
    metrics = json.loads((folder / "metrics.json").read_text())
    histories = [metrics["history"]] + [seed["history"] for seed in metrics.get("seeds", [])]
    return [[without_rates(row) for row in rows] for rows in histories]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_then_resume_ends_like_an_uninterrupted_run(tmp_path, case):
    extra, total, seeds, resume_file = CASES[case]
    args = [*DQN, *extra, f"total_steps={total}", *LOGS, f"checkpoint_every={EVERY}"]
    whole = run_cli([*args, "hydra.run.dir=whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    cut = tmp_path / "cut"
    _kill_after_checkpoint([*args, "hydra.run.dir=cut"], tmp_path, cut, resume_file)

    # Killed mid-run: its config and last periodic checkpoint, none of the end's files.
    names = {path.name for path in cut.iterdir()}
    assert {"config.yaml", resume_file} <= names and "metrics.json" not in names, names
    saved = statefile.load(cut / resume_file)
    if "step" in saved:  # host-driven: the first iteration (4 envs) at a multiple of EVERY
        assert saved["step"] % EVERY < 4 and 0 < saved["step"] < total, saved["step"]
    else:  # fused: the chunk that ends at a multiple of EVERY
        assert saved["iterations"] * 8 % EVERY == 0 and 0 < saved["iterations"] * 8 < total

    # checkpoint_every may differ on resume: it says when to save, not what to train.
    resume = [*args, "checkpoint_every=0", "resume=cut", "hydra.run.dir=resumed"]
    resumed = run_cli(resume, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = (json.loads((tmp_path / f / "metrics.json").read_text()) for f in ("whole", "resumed"))
    assert b["status"] == "FINISHED"
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    assert _rows(tmp_path / "whole") == _rows(tmp_path / "resumed")
    for seed in range(seeds) if seeds > 1 else [None]:
        assert saved_agent(tmp_path / "whole", seed) == saved_agent(tmp_path / "resumed", seed)


def test_writes_at_each_multiple_of_the_steps_from_where_the_run_starts():
    written = []
    schedule = CheckpointSchedule(800, 3000, written.append)
    schedule.start(0)
    for step in range(4, 3004, 4):  # 4 envs a step
        schedule.reached(step)
    assert written == [800, 1600, 2400]  # not 3000: the run's end writes its files
    resumed = CheckpointSchedule(800, 3000, written.append)
    resumed.start(1204)
    for step in range(1224, 3024, 20):
        resumed.reached(step)
    assert written[3:] == [1604, 2404]
    off = CheckpointSchedule(0, 3000, written.append)
    off.start(0)
    off.reached(2000)
    assert len(written) == 5


def test_auto_waits_for_the_period_and_49_times_the_last_write(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(recording.time, "monotonic", lambda: now[0])

    def write(step: int) -> None:
        written.append(step)
        now[0] += 2.0  # a slow write: the next waits 49 x 2 s, not 30 s

    written: list[int] = []
    schedule = CheckpointSchedule("auto", 10**6, write)
    schedule.start(0)
    for step in range(1, 300):
        now[0] += 1.0  # one second of training per step
        schedule.reached(step)
    assert written[:3] == [30, 128, 226]
