"""Sweeps on a real one-node SLURM cluster (slurmctld, slurmd, slurmdbd with MariaDB, munge),
a shared Optuna study on a real PostgreSQL server and a real MLflow server backed by
PostgreSQL, all started here by tests/local_cluster.py: ``hydra/launcher=submitit_slurm``.

* two sweep workers share one study: exactly ``n_trials`` trials, none lost or duplicated,
  in Optuna and in MLflow;
* a worker killed mid-trial (on "another machine", its own hostname): its trial becomes FAIL
  through the database heartbeats, its orphaned job stops, and the sweep completes;
* a trial job warned with SIGUSR2 (SLURM's time-limit / preemption notice), or preempted by
  a job of a higher-priority partition (SIGTERM, requeued by SLURM), saves its run, is
  requeued, and continues: one Optuna trial, one MLflow run, every env step once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RLSPEED, cli_env
from tests.local_cluster import URGENT_PARTITION, LocalCluster, unavailable

REASON = unavailable()
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(REASON is not None, reason=f"no local SLURM cluster: {REASON}"),
    # Each test starts a SLURM cluster, PostgreSQL and an MLflow server of its own.
    pytest.mark.timeout(1800),
]

# A cheap DQN trial: ~2 s of training on torch + gym-sync, plus the job's start.
TRIAL = [
    "backend=torch",
    "env=gym-sync",
    "total_steps=3000",
    "algo.learning_starts=500",
    "algo.hidden_sizes=[16]",
    "log_every=1000",
    "progress=plain",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


def sweep_args(
    cluster: LocalCluster, study: str, n_trials: int, *extra: str, cpus: int = 1
) -> list[str]:
    """A sweep worker's command line, as docs/cluster/ writes it."""
    return [
        "-m",
        "hparams=dqn_search",
        "hydra/launcher=submitit_slurm",
        f"hydra.launcher.partition={cluster.partition}",
        f"hydra.launcher.cpus_per_task={cpus}",
        # submitit counts a signal in the last 10 minutes of a job as its time limit, not a
        # preemption (not requeued unless max_num_timeout allows it).
        "hydra.launcher.timeout_min=60",
        "hydra/sweeper/pruner=none",
        f"hydra.sweeper.storage={cluster.optuna_url}",
        f"hydra.sweeper.study_name={study}",
        f"hydra.sweeper.n_trials={n_trials}",
        f"tracking.uri={cluster.mlflow_uri}",
        f"tracking.experiment={study}",
        *TRIAL,
        *extra,
    ]


def start_worker(
    cluster: LocalCluster, cwd: Path, args: list[str], hostname: str | None = None
) -> subprocess.Popen:
    """Start a sweep worker; ``hostname``: in a UTS namespace of its own, so that it looks
    like a sweep on another machine (judged by its heartbeats, not by its pid)."""
    cwd.mkdir(parents=True, exist_ok=True)
    command = [RLSPEED, *args]
    if hostname is not None:
        command = ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "-"]
        command += [RLSPEED, *args]
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=cli_env(cluster.env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def running_jobs(cluster: LocalCluster, cwd: Path) -> list[str]:
    """The ids of the RUNNING jobs submitted from ``cwd`` (a test's own worker: the cluster is
    shared by the tests of this file, and an earlier test's jobs may still be ending)."""
    out = cluster.run("squeue", "--noheader", "--states=RUNNING", "-o", "%i|%Z").stdout
    return [
        job
        for job, folder in (line.split("|") for line in out.splitlines())
        if Path(folder).is_relative_to(cwd)
    ]


def wait_for_training(cwd: Path) -> None:
    """Until the trial job of the worker in ``cwd`` trains (its run logged step 2,000): a
    job that SLURM shows RUNNING may still be starting Python, where submitit ignores the
    SIGTERM of a scancel."""
    logs = cwd / "outputs" / "multirun"

    def training() -> bool:
        return any("step 2,000/" in log.read_text() for log in logs.glob("*/*/*/rlspeed.log"))

    wait_for(training, 120, "the trial to train")


def finish(worker: subprocess.Popen, timeout: float = 240) -> str:
    output, _ = worker.communicate(timeout=timeout)
    assert worker.returncode == 0, output[-4000:]
    return output


def trials(cluster: LocalCluster, study: str) -> list:
    import optuna

    return optuna.load_study(study_name=study, storage=cluster.optuna_url).get_trials()


def trial_runs(cluster: LocalCluster, study: str) -> list:
    """The MLflow runs of the study's trials (not the study's parent run)."""
    from mlflow import MlflowClient

    client = MlflowClient(cluster.mlflow_uri)
    experiment = client.get_experiment_by_name(study)
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    return [run for run in runs if "optuna.trial" in run.data.tags]


def wait_for(condition, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_two_workers_share_one_capped_study(cluster: LocalCluster, tmp_path: Path) -> None:
    study = "two_workers"
    args = sweep_args(cluster, study, 8, "hydra.sweeper.n_jobs=2")
    workers = [start_worker(cluster, tmp_path / name, args) for name in ("a", "b")]
    outputs = [finish(worker) for worker in workers]

    from optuna.trial import TrialState

    study_trials = trials(cluster, study)
    assert [t.number for t in study_trials] == list(range(8))
    assert [t.state for t in study_trials] == [TrialState.COMPLETE] * 8
    assert not any("surplus" in t.user_attrs for t in study_trials)
    # Every trial ran once, by one of the two workers.
    ran = [[int(n) for n in _told(output)] for output in outputs]
    assert sorted(ran[0] + ran[1]) == list(range(8)), ran
    runs = trial_runs(cluster, study)
    assert sorted(int(run.data.tags["optuna.trial"]) for run in runs) == list(range(8))
    assert {run.info.status for run in runs} == {"FINISHED"}
    for t in study_trials:  # each trial's folder holds its finished run
        metrics = json.loads((Path(t.user_attrs["output_dir"]) / "metrics.json").read_text())
        assert metrics["status"] == "FINISHED" and metrics["env_steps"] == 3000


def _told(output: str) -> list[str]:
    """The trial numbers a worker's log says it recorded as COMPLETE."""
    lines = [
        line for line in output.splitlines() if "[HYDRA] Trial " in line and ": COMPLETE" in line
    ]
    return [line.split("[HYDRA] Trial ")[1].split(":")[0] for line in lines]


def test_killed_worker_leaves_fail_and_the_sweep_completes(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    study = "killed_worker"
    beats = ["hydra.sweeper.heartbeat_s=1", "hydra.sweeper.grace_s=4"]
    # Worker A's trial trains long enough to be killed mid-trial, and reports often.
    slow = ["total_steps=200000", "hydra.sweeper.report_every=2000", *beats]
    worker_a = start_worker(
        cluster, tmp_path / "a", sweep_args(cluster, study, 3, *slow), hostname="login-a"
    )
    from optuna.trial import TrialState

    def running_job() -> bool:
        running = any(t.state == TrialState.RUNNING for t in _safe_trials(cluster, study))
        return running and bool(running_jobs(cluster, tmp_path))

    wait_for(running_job, 120, "worker A's trial job to run")
    (orphan,) = running_jobs(cluster, tmp_path)
    os.killpg(worker_a.pid, signal.SIGKILL)  # the worker, not its SLURM job
    worker_a.communicate(timeout=30)
    time.sleep(5)  # longer than grace_s: no heartbeat since the kill

    worker_b = start_worker(cluster, tmp_path / "b", sweep_args(cluster, study, 3, *beats))
    output = finish(worker_b)
    assert "were left running by a sweep that is gone: marked FAIL" in output
    states = [t.state for t in trials(cluster, study)]
    assert states == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    # The orphaned job stops at its next report, its run marked FAILED, not FINISHED.
    wait_for(lambda: all(job["job_id"] != orphan for job in cluster.squeue()), 120, "the orphan")
    runs = {int(run.data.tags["optuna.trial"]): run for run in trial_runs(cluster, study)}
    assert sorted(runs) == [0, 1, 2]
    assert runs[0].info.status == "FAILED"
    assert {runs[1].info.status, runs[2].info.status} == {"FINISHED"}


def test_cancelled_trial_job_fails_its_trial_alone(cluster: LocalCluster, tmp_path: Path) -> None:
    study = "cancelled_job"
    args = sweep_args(cluster, study, 2, "total_steps=12000", "hydra.sweeper.max_failure_rate=1")
    worker = start_worker(cluster, tmp_path, args)
    wait_for_training(tmp_path)
    cluster.run("scancel", *running_jobs(cluster, tmp_path))  # lost: no result comes back
    output = finish(worker)
    assert "ended without a result (state CANCELLED" in output
    from optuna.trial import TrialState

    assert [t.state for t in trials(cluster, study)] == [TrialState.FAIL, TrialState.COMPLETE]


def test_stopped_worker_cancels_its_trial_jobs(cluster: LocalCluster, tmp_path: Path) -> None:
    study = "stopped_worker"
    worker = start_worker(cluster, tmp_path, sweep_args(cluster, study, 2, "total_steps=200000"))
    wait_for_training(tmp_path)
    (job,) = running_jobs(cluster, tmp_path)
    worker.send_signal(signal.SIGTERM)  # a stopped sweep (its own job preempted, say)
    output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGTERM, output[-3000:]
    wait_for(lambda: all(j["job_id"] != job for j in cluster.squeue()), 60, "the job's end")
    states = cluster.sacct_states(job)
    assert states[job] == "CANCELLED", states
    from optuna.trial import TrialState

    assert [t.state for t in trials(cluster, study)] == [TrialState.FAIL]


def _safe_trials(cluster: LocalCluster, study: str) -> list:
    try:
        return trials(cluster, study)
    except KeyError:  # the study is not created yet
        return []


@pytest.mark.parametrize("preemption", ["usr2", "urgent_job"])
def test_preempted_trial_job_is_requeued_and_continues(
    cluster: LocalCluster, tmp_path: Path, preemption: str
) -> None:
    """usr2: SLURM's warning signal (``scancel --signal=USR2``, as before a time limit);
    urgent_job: a job of a higher-priority partition preempts the trial's (SIGTERM, then
    SLURM requeues it: PreemptMode=REQUEUE)."""
    study = f"preempted_{preemption}"
    total = 60000
    worker = start_worker(
        cluster,
        tmp_path,
        sweep_args(
            cluster,
            study,
            1,
            f"total_steps={total}",
            "hydra.sweeper.report_every=20000",
            # The whole node, so that the urgent job needs the trial job's CPUs.
            cpus=cluster.cpus,
        ),
    )
    wait_for_training(tmp_path)
    if preemption == "usr2":
        cluster.run("scancel", "--signal=USR2", *running_jobs(cluster, tmp_path))
    else:
        urgent = [f"--partition={URGENT_PARTITION}", "--cpus-per-task=1", "--output=/dev/null"]
        cluster.run("sbatch", *urgent, "--wrap=true")
    output = finish(worker, timeout=300)

    from optuna.trial import TrialState

    (trial,) = trials(cluster, study)
    assert trial.state == TrialState.COMPLETE
    folder = Path(trial.user_attrs["output_dir"])
    log = (folder / "rlspeed.log").read_text()
    assert "interrupted; saving a checkpoint" in log
    assert "requeueing the job" in log
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["env_steps"] == total
    (run,) = trial_runs(cluster, study)  # one MLflow run: the requeued job continued it
    assert run.info.status == "FINISHED"
    assert run.data.tags["rlspeed.slurm_restarts"] == "1"
    assert run.info.run_id == metrics["mlflow_run_id"]
    from mlflow import MlflowClient

    history = MlflowClient(cluster.mlflow_uri).get_metric_history(
        run.info.run_id, "charts/rolling_step_reward"
    )
    steps = [point.step for point in history]
    assert steps == sorted(set(steps)) and steps[-1] == total, steps
    assert "Trial 0: COMPLETE" in output


def test_no_password_reaches_the_files_of_a_sweep_or_its_jobs(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A password in hydra.sweeper.storage and tracking.uri (the cluster's PostgreSQL trusts
    loopback, its MLflow server asks for none: any password connects) is in no file the
    sweep, its SLURM job and submitit leave (the job's pickles included), nor in its output."""
    password = "pw-on-the-command-line"
    storage = cluster.optuna_url.replace("://rlspeed@", f"://rlspeed:{password}@")
    uri = cluster.mlflow_uri.replace("://", f"://user:{password}@")
    args = [
        a
        for a in sweep_args(cluster, "secrets", 1)
        if not a.startswith(("hydra.sweeper.storage=", "tracking.uri="))
    ]
    args += [f"hydra.sweeper.storage={storage}", f"tracking.uri={uri}"]
    output = finish(start_worker(cluster, tmp_path, args))
    assert [t.state.name for t in trials(cluster, "secrets")] == ["COMPLETE"]
    assert list(tmp_path.glob("outputs/multirun/*/*/.submitit/*/*_submitted.pkl"))
    assert password not in output
    held = [p for p in tmp_path.rglob("*") if p.is_file() and password.encode() in p.read_bytes()]
    assert held == []
