"""Faults lose nothing (SPEC §9): a full disk when the run saves, an MLflow server killed
mid-run or mid-sweep, Ctrl-C in a multi-seed run, SIGTERM in a sweep. Each test drives the
real CLI into the real fault and checks the one line, the exit code, the MLflow record and
the files."""

from __future__ import annotations

import json
import os
import re
import resource
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from tests.conftest import start_cli, wait_for_log
from tests.test_sweep_faults import STUDY, SWEEP
from tests.test_tracking import _only_run, assert_every_row_in_mlflow, mlflow_server

# Fault injection: each test kills, fills or signals a real run.
pytestmark = pytest.mark.slow

# A host-driven torch run: starts in seconds, logs every 1000 steps.
HOST_RUN = [
    "backend=torch",
    "env=gym-sync",
    "num_envs=4",
    "log_every=1000",
    "algo.learning_starts=500",
    "algo.buffer_size=5000",
    "algo.batch_size=32",
    "algo.hidden_sizes=[16]",
    "progress=plain",
]
# MLflow's own INFO lines (a new store's tables, a new experiment) go to stderr beside rlspeed's.
_MLFLOW_INFO = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO mlflow")


def _one_line(stderr: str, *fragments: str) -> str:
    """The one line rlspeed wrote to stderr, holding every fragment."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not _MLFLOW_INFO.match(line)]
    assert len(lines) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _wait_for(process: subprocess.Popen, text: str) -> None:
    """Read the run's output until a line holds ``text`` (the run is where the test wants
    it); fails after 120 s, silent output included."""
    deadline = time.monotonic() + 120
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([process.stdout], [], [], left)[0]:
            break
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the run ended before {text!r}: {process.communicate()[1]}")
        if text in line:
            return
    raise AssertionError(f"no {text!r} within 120 s")


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        # Writes past `limit` bytes fail with EFBIG, as writes on a full disk fail with
        # ENOSPC (ignoring SIGXFSZ, which would otherwise kill the process).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _names(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


def test_full_disk_at_save_fails_the_run_and_keeps_every_other_file(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # Files may grow to 2.5 MB: the MLflow store (~1 MB), config, metrics and plot fit; the
    # checkpoint of a 512x512 network with its Adam state (~5 MB) does not.
    args = [
        *HOST_RUN,
        "total_steps=400",
        "log_every=200",
        "eval_every=400",
        "algo.learning_starts=200",
        "algo.hidden_sizes=[512,512]",
        f"tracking.uri={uri}",
    ]
    process = start_cli(args, tmp_path, preexec_fn=_file_size_limit(2_500_000))
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1
    out_dir = next((tmp_path / "outputs").glob("*/*"))
    line = _one_line(stderr, "could not write checkpoint.pt", f"in {out_dir}: File too large")
    # No half-written checkpoint and no temporary file left; every other file whole.
    names = _names(out_dir)
    assert "checkpoint.pt" not in names and not any(n.endswith(".tmp") for n in names), names
    assert {"config.yaml", "learning_curve.png", "metrics.json"} <= names
    assert (out_dir / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    assert "total_steps: 400" in (out_dir / "config.yaml").read_text()
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["status"] == "FAILED" and metrics["env_steps"] == 400
    assert metrics["errors"] == [line.removeprefix("rlspeed: ")]
    # MLflow: FAILED, with the metrics logged during training and the files that were written.
    client, run = _only_run(uri)
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "charts/SPS")] == [200, 400]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "learning_curve.png", "metrics.json"}


def test_killed_mlflow_server_costs_seconds_and_no_results(tmp_path):
    with mlflow_server(tmp_path) as (server, uri):
        process = start_cli(
            [*HOST_RUN, "total_steps=1500", "log_every=500", f"tracking.uri={uri}"], tmp_path
        )
        _wait_for(process, "step 500/")
        os.killpg(server.pid, signal.SIGKILL)  # the server and its workers
        # A bound on a hang, not a speed: MLflow's own HTTP settings would wait ~12 minutes,
        # then print a traceback; the writer's retries give up within a minute or two.
        _, stderr = process.communicate(timeout=180)
    assert process.returncode == 1
    out_dir = next((tmp_path / "outputs").glob("*/*"))
    line = _one_line(
        stderr, f"the MLflow server at {uri} stopped answering (Connection refused)", str(out_dir)
    )
    # Training went on to the end and its results are all in the output folder.
    assert {"config.yaml", "checkpoint.pt", "learning_curve.png", "metrics.json"} <= _names(out_dir)
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["env_steps"] == 1500 and metrics["final"]["step"] == 1500
    assert metrics["status"] == "FAILED" and metrics["errors"] == [line.removeprefix("rlspeed: ")]
    assert [row["step"] for row in metrics["history"]] == [500, 1000, 1500]


def test_mlflow_server_back_mid_run_gets_every_row_then_ctrl_c_keeps_them(tmp_path):
    """A server that dies and comes back (same port, same store) while the run trains gets
    every row the run logged meanwhile; Ctrl-C then ends the run KILLED with MLflow's rows
    equal to metrics.json's."""
    args = [*HOST_RUN, "total_steps=10000000", "log_every=500"]
    with mlflow_server(tmp_path) as (server, uri):
        process = start_cli([*args, f"tracking.uri={uri}"], tmp_path)
        _wait_for(process, "step 500/")
        os.killpg(server.pid, signal.SIGKILL)
        _wait_for(process, "stopped answering")
    port = int(uri.rsplit(":", 1)[1])
    with mlflow_server(tmp_path, port) as (_, uri):
        _wait_for(process, "answers again")
        _wait_for(process, "step ")  # a row logged after the server came back
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 130, stderr
        out_dir = next((tmp_path / "outputs").glob("*/*"))
        _one_line(stderr, "rlspeed: interrupted by SIGINT", "KILLED", str(out_dir))
        client, run = _only_run(uri)
        assert run.info.status == "KILLED"
        metrics = json.loads((out_dir / "metrics.json").read_text())
        assert metrics["status"] == "KILLED" and metrics["errors"] == []
        assert len(metrics["history"]) >= 3
        assert_every_row_in_mlflow(client, run.info.run_id, out_dir)


def test_ctrl_c_in_seed_0_of_3_ends_killed_with_what_was_recorded(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [
        *HOST_RUN,
        "total_steps=10000000",
        "log_every=500",
        "num_seeds=3",
        f"tracking.uri={uri}",
    ]
    process = start_cli(args, tmp_path)
    _wait_for(process, "step 1,000/")  # seed 0 has logged twice; seeds 1 and 2 not yet
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130
    out_dir = next((tmp_path / "outputs").glob("*/*"))
    _one_line(stderr, "rlspeed: interrupted by SIGINT", "KILLED", str(out_dir))
    client, run = _only_run(uri)
    assert run.info.status == "KILLED"
    assert len(client.get_metric_history(run.info.run_id, "seed0/charts/SPS")) >= 2
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"checkpoint_seed0.pt", "metrics.json", "learning_curve.png"} <= artifacts
    # No step was logged by every seed: metrics.json holds each seed's own last row.
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["status"] == "KILLED" and metrics["final"] is None
    seed0, seed1, seed2 = metrics["seeds"]
    assert seed0["final"]["step"] >= 1000 and seed0["env_steps"] >= 1000
    assert seed1["final"] is None and seed2["final"] is None
    assert_every_row_in_mlflow(client, run.info.run_id, out_dir)
    assert (out_dir / "learning_curve.png").read_bytes().startswith(b"\x89PNG")


def test_sigterm_in_a_sweep_stops_it_with_one_line_and_exit_143(tmp_path):
    args = ["-m", "seed=1,2", *HOST_RUN, "total_steps=10000000", "tracking=none"]
    process = start_cli(args, tmp_path)
    _wait_for(process, "step 1,000/")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143
    jobs = list((tmp_path / "outputs" / "multirun").glob("*/*/*_torch_*"))
    assert len(jobs) == 1, jobs  # the sweep stopped: the second job never started
    _one_line(stderr, "rlspeed: interrupted by SIGTERM", "KILLED", str(jobs[0]))
    assert {"config.yaml", "checkpoint.pt", "learning_curve.png", "metrics.json"} <= _names(jobs[0])
    metrics = json.loads((jobs[0] / "metrics.json").read_text())
    assert metrics["status"] == "KILLED" and metrics["final"]["step"] >= 1000


def test_mlflow_server_killed_mid_sweep_costs_only_its_copy(tmp_path):
    """SPEC §9 for sweeps: the server dies after the first trial; every later trial still
    trains and keeps its results in its folder and the study, the sweep completes (exit 0),
    and its last line says what MLflow did not get."""
    storage = f"sqlite:///{tmp_path}/study.db"
    sweep = [arg for arg in SWEEP if arg != "tracking=none"]
    sweep += ["hydra.sweeper.n_trials=3", f"hydra.sweeper.storage={storage}"]
    with mlflow_server(tmp_path) as (server, uri):
        process = start_cli([*sweep, f"tracking.uri={uri}"], tmp_path, stderr=subprocess.STDOUT)
        _wait_for(process, "Trial 0: COMPLETE")
        os.killpg(server.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    for trial in study.trials:
        metrics = json.loads((Path(trial.user_attrs["output_dir"]) / "metrics.json").read_text())
        assert metrics["env_steps"] == 500 and metrics["status"] == "FINISHED"
        assert bool(metrics["errors"]) == (trial.number > 0), metrics["errors"]
    last = [line for line in output.splitlines() if line.strip()][-1]
    assert "not everything reached MLflow" in last and "trial(s) 1, 2" in last, output
    assert "parent run" in last and "Traceback" not in output


def _children(pid: int, marker: str) -> list[int]:
    """Processes whose parent is ``pid`` and whose command line holds ``marker``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if ppid == pid and marker in command:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie nobody reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_sigkill_of_a_joblib_sweep_stops_its_workers(tmp_path):
    """Workers of a killed sweep die with it: the trials they train stop as on SIGTERM
    (KILLED, with what they recorded) instead of training on for no one."""
    args = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra/launcher=joblib",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.n_trials=2",
        "algo.learning_rate=interval(0.0001, 0.001)",
        *HOST_RUN,
        "total_steps=10000000",
        "tracking=none",
    ]
    process = start_cli(args, tmp_path, stderr=subprocess.STDOUT)
    wait_for_log(process, tmp_path, "outputs/multirun/*/*/*/rlspeed.log", "step 1,000/")
    workers = _children(process.pid, "popen_loky_posix")
    assert workers, "no joblib worker found"
    process.kill()
    process.wait()
    deadline = time.monotonic() + 120
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "the workers outlived their sweep by 120 s"
        time.sleep(1)
    trials = list((tmp_path / "multirun").glob("*/*/*/metrics.json"))
    trials += list((tmp_path / "outputs" / "multirun").glob("*/*/*/metrics.json"))
    saved = [json.loads(path.read_text()) for path in trials]
    assert saved and all(metrics["status"] == "KILLED" for metrics in saved), saved
    # The trial whose log line the test waited for kept its rows (the other may have had none).
    assert max(m["final"]["step"] for m in saved if m["final"]) >= 1000
