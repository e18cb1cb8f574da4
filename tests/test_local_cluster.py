"""The throwaway cluster the SLURM tests run on: jobs, accounting, requeue, PostgreSQL, MLflow."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import mlflow
import psycopg
import pytest

from tests.local_cluster import LocalCluster, unavailable

REASON = unavailable()
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    pytest.mark.timeout(1800),  # a SLURM cluster, PostgreSQL and an MLflow server start
]

# The job prints its pid and restart count, then sleeps for its argument's seconds.
JOB = '#!/bin/bash\necho "pid=$$ restart=${SLURM_RESTART_COUNT:-0}"\nsleep "$1"\n'


def wait_for(what: str, check: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_local_cluster_runs_jobs_requeues_and_serves_postgres_and_mlflow(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    with LocalCluster(tmp_path / "cluster") as cluster:

        def submit(*args: str) -> str:
            out = f"{tmp_path}/%j.out"
            sbatch = cluster.run("sbatch", "--parsable", "--open-mode=append", "-o", out, *args)
            return sbatch.stdout.strip()

        def output(job: str) -> str:
            path = tmp_path / f"{job}.out"
            return path.read_text() if path.exists() else ""

        short = submit(str(script), "1")
        long = submit("--requeue", str(script), "300")
        cancelled = submit(str(script), "300")
        cluster.run("scancel", cancelled)
        wait_for("start of the long job", lambda: "restart=0" in output(long), 30)
        cluster.run("scontrol", "requeue", long)

        # Meanwhile: PostgreSQL as the rlspeed role, and the MLflow server with its artifacts.
        with psycopg.connect(cluster.optuna_url.replace("+psycopg", "")) as db:
            db.execute("CREATE TABLE smoke (x integer)")
            db.execute("INSERT INTO smoke VALUES (7)")
            assert db.execute("SELECT x FROM smoke").fetchall() == [(7,)]
        with urllib.request.urlopen(f"{cluster.mlflow_uri}/health") as reply:
            assert reply.read() == b"OK"
        client = mlflow.MlflowClient(cluster.mlflow_uri)
        run_id = client.create_run(client.create_experiment("smoke")).info.run_id
        client.log_metric(run_id, "loss", 0.5)
        client.log_text(run_id, "hello", "note.txt")
        assert client.get_run(run_id).data.metrics == {"loss": 0.5}
        assert [f.path for f in client.list_artifacts(run_id)] == ["note.txt"]
        assert list((cluster.folder / "mlflow" / "artifacts").rglob("note.txt"))

        completed = lambda: cluster.sacct_states(short).get(short) == "COMPLETED"  # noqa: E731
        wait_for("COMPLETED in sacct", completed, 30)
        assert output(short).startswith("pid=") and "restart=0" in output(short)
        assert cluster.sacct_states(cancelled)[cancelled] == "CANCELLED"
        wait_for("restart of the requeued job", lambda: "restart=1" in output(long), 30)
        assert cluster.sacct_states(long)[long] == "RUNNING"
        assert [job["state"] for job in cluster.squeue()] == ["RUNNING"]
        job_pid = int(re.findall(r"pid=(\d+) restart=1", output(long))[0])
        assert running(job_pid)
        # The running job and every daemon must die with the cluster.
        pids = [job_pid, *cluster.pids.values()]
    assert [pid for pid in pids if running(pid)] == []
