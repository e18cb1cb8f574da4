"""``backend.seed_workers``: a host-driven run's seeds trained in worker processes at once log
exactly what the same seeds trained one after another log (rates aside), write the same
agents, stop and resume exactly, and fail in one line; bad values are one line, exit 2.

Exact, not to float rounding: a worker runs the very code the run's process would for its
seed (its setup, envs, learner and evaluations, from the same seeds, on as many threads: these
agents are small, ``backend.threads=auto`` gives them one either way), in a process of its
own, and the run's process records what it sends as it records a seed it trains itself; the
mean over seeds is taken in seed order whichever seed logs a step last. (A network that
``auto`` gives every core alone gets cores / workers in a worker, and torch's kernels then
round differently: README.)"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlspeed.errors import ConfigError
from rlspeed.validation import check
from tests.conftest import refused_line, run_cli, run_in, saved_agent, start_cli, without_rates

# Tabular Q-learning on GridWorld: three seeds in a few seconds.
QLEARN = [
    "algo=qlearn", "task=gridworld", "backend=torch", "env=gym-sync", "num_seeds=3",
    "total_steps=3000", "log_every=500", "eval_every=1000", "tracking=none", "progress=plain",
]  # fmt: skip
# Tiny DQN (tests/test_resume.py's), three seeds; a log and an evaluation every 400 steps.
DQN = [
    "algo=dqn", "task=gridworld", "algo.hidden_sizes=[16]", "algo.learning_starts=200",
    "algo.buffer_size=1000", "algo.batch_size=32", "algo.target_network_frequency=200",
    "tracking=none", "progress=plain", "env=gym-sync", "num_envs=4", "num_seeds=3",
    "log_every=400", "eval_every=400",
]  # fmt: skip
TWO = "backend.seed_workers=2"


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def _rows(folder: Path) -> list[list[dict[str, float]]]:
    """The run's rows (means over seeds), then each seed's, rates aside."""
    metrics = _metrics(folder)
    histories = [metrics["history"]] + [seed["history"] for seed in metrics["seeds"]]
    return [[without_rates(row) for row in rows] for rows in histories]


def _same_run(a: Path, b: Path, seeds: int = 3) -> None:
    """Runs ``a`` and ``b`` logged the same rows and saved the same agents."""
    assert _rows(a) == _rows(b)
    assert all(len(rows) > 1 for rows in _rows(a))
    for key in ("score", "rolling_step_reward", "recent_return", "env_steps", "gradient_updates"):
        assert _metrics(a)[key] == _metrics(b)[key], key
    for index in range(seeds):
        if (a / "checkpoint_seed0.pt").exists():
            assert saved_agent(a, index) == saved_agent(b, index), index
        else:
            name = f"checkpoint_seed{index}.msgpack"
            assert (a / name).read_bytes() == (b / name).read_bytes(), index


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_seeds_in_two_workers_log_what_seeds_one_after_another_log(tmp_path, make_cfg, monkeypatch):
    run_in(tmp_path / "alone", monkeypatch, make_cfg(QLEARN))  # in this process: quicker
    parallel = run_cli([*QLEARN, TWO, "hydra.run.dir=workers"], tmp_path)
    _ok(parallel)
    _same_run(tmp_path / "alone", tmp_path / "workers")
    assert _metrics(tmp_path / "alone")["seed_workers"] == 1
    workers = _metrics(tmp_path / "workers")
    assert workers["seed_workers"] == 2 and workers["devices"] == ["cpu"]
    assert re.search(r"seed workers +│ 2 ", parallel.stdout), parallel.stdout
    # Each seed's files, as seeds one after another write them.
    names = sorted(path.name for path in (tmp_path / "workers").glob("*_seed*"))
    files = [("checkpoint", "pt"), ("resume", "npz")]
    assert names == [f"{kind}_seed{i}.{ext}" for kind, ext in files for i in range(3)]


COUNT = "expected auto, or an integer in [1, 256]"


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["backend.seed_workers=0"], f"invalid backend.seed_workers=0: {COUNT}"),
        (["backend.seed_workers=-2"], f"invalid backend.seed_workers=-2: {COUNT}"),
        (["backend.seed_workers=257"], f"invalid backend.seed_workers=257: {COUNT}"),
        (["backend.seed_workers=many"], f"invalid backend.seed_workers=many: {COUNT}"),
        # The schema's own line, as for every key typed int or a word.
        (["backend.seed_workers=1.5"], "invalid backend.seed_workers: Value '1.5' of type"),
        (
            ["backend=flax", "env=jax-vmap", "backend.seed_workers=2"],
            "invalid backend.seed_workers=2: expected 1 or auto on the fused path",
        ),
    ],
)
def test_a_bad_worker_count_is_one_line_exit_2(overrides, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = refused_line([*overrides, "num_seeds=4", "tracking=none"], capsys)
    assert line.startswith(f"rlspeed: {said}"), line
    assert list(tmp_path.iterdir()) == []


def test_a_task_given_to_train_that_does_not_pickle_is_refused_before_anything(tmp_path):
    import rlspeed
    from rlspeed.core.tasks.gridworld import SPEC

    mine = dataclasses.replace(SPEC, name="my-grid")  # GridWorld's spec holds lambdas
    settings = {"num_seeds": 2, "backend.seed_workers": 2, "total_steps": 2000}
    with pytest.raises(ConfigError) as refused:
        rlspeed.train(algo="qlearn", task=mine, backend="torch", env="gym-sync",
                      tracking="none", out_dir=tmp_path / "run", **settings)  # fmt: skip
    assert str(refused.value).startswith(
        "rlspeed: invalid backend.seed_workers=2: expected 1 with task=my-grid, a TaskSpec "
        "given to rlspeed.train that does not pickle (PicklingError: "
    )
    assert not (tmp_path / "run").exists()


def test_workers_resolve_to_at_most_the_seeds_and_share_the_cores(make_cfg):
    cores = os.cpu_count() or 1
    host = ["backend=torch", "env=gym-sync", "tracking=none"]
    auto = check(make_cfg([*host, "num_seeds=3", "backend.seed_workers=auto"])).cfg.backend
    assert auto.seed_workers == min(3, cores)
    assert check(make_cfg([*host, "backend.seed_workers=4"])).cfg.backend.seed_workers == 1
    # DQN on Doors takes every core but one alone (backend.threads=auto on torch); two
    # workers share the cores, where it takes more than one.
    doors = [*host, "algo=dqn", "task=doors", "num_seeds=2"]
    alone = max(1, cores - 1)
    assert check(make_cfg(doors)).cfg.backend.threads == alone
    shared = check(make_cfg([*doors, TWO])).cfg.backend
    assert (shared.seed_workers, shared.threads) == (2, 1 if alone == 1 else max(1, cores // 2))
    given = check(make_cfg([*doors, TWO, "backend.threads=1"])).cfg.backend
    assert given.threads == 1
    fused = check(make_cfg(["num_seeds=2", "backend.seed_workers=auto", "tracking=none"]))
    assert fused.cfg.backend.seed_workers == 1


# ---------------------------------------------------------------- slow: stops, deaths, flax


def _workers(pid: int) -> list[int]:
    """The seed worker processes of the run in process ``pid`` (multiprocessing's resource
    tracker is a child of it too)."""
    find = ["pgrep", "-P", str(pid), "-f", "spawn_main"]
    return [
        int(child) for child in subprocess.run(find, capture_output=True, text=True).stdout.split()
    ]


def _cut(args: list[str], cwd: Path, folder: Path, how: signal.Signals) -> list[int]:
    """Start the CLI; SIGTERM it after its first progress line, or SIGKILL it once a
    periodic write has put resume_seed1.npz in ``folder``. Returns its workers' ids."""
    with start_cli(args, cwd, stderr=subprocess.STDOUT) as proc:
        if how == signal.SIGTERM:
            for line in proc.stdout:
                if " - step " in line:
                    break
        else:
            while not (folder / "resume_seed1.npz").exists() and proc.poll() is None:
                time.sleep(0.01)
        workers = _workers(proc.pid)
        proc.send_signal(how)
        out = proc.stdout.read()
        proc.wait(timeout=120)
    code = 128 + how if how == signal.SIGTERM else -how
    assert proc.returncode == code, out[-3000:]
    assert len(workers) == 2
    return workers


def _gone(pids: list[int], within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.1)
    return False


# The runs the slow tests below cut: three DQN seeds in two workers, a resume point every
# 800 steps.
CUT_DQN = [*DQN, "backend=torch", "total_steps=6000", "checkpoint_every=800", TWO]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CUT_DQN run to its end without a stop: what each cut run, resumed, must equal."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    _ok(run_cli([*CUT_DQN, "hydra.run.dir=whole"], folder))
    return folder / "whole"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "resumed_in"), [(signal.SIGTERM, 2), (signal.SIGKILL, 1)], ids=["SIGTERM", "SIGKILL"]
)
def test_a_run_of_workers_stopped_then_resumed_ends_like_one_uninterrupted(
    tmp_path, uninterrupted, how, resumed_in
):
    """Each stop is resumed one way (SIGTERM's in two workers, SIGKILL's one seed after
    another): either way, the uninterrupted run."""
    workers = _cut([*CUT_DQN, "hydra.run.dir=cut"], tmp_path, tmp_path / "cut", how)
    # Its workers end with it, even when it is killed outright (their link to it closes).
    assert _gone(workers)
    if how == signal.SIGTERM:
        assert _metrics(tmp_path / "cut")["status"] == "KILLED"
    resume = [*CUT_DQN, "resume=cut", f"backend.seed_workers={resumed_in}", "hydra.run.dir=r"]
    _ok(run_cli(resume, tmp_path))
    _same_run(uninterrupted, tmp_path / "r")


@pytest.mark.slow
def test_a_worker_that_dies_is_one_line_and_the_run_resumes_from_its_last_write(
    tmp_path, uninterrupted
):
    with start_cli([*CUT_DQN, "hydra.run.dir=dead"], tmp_path) as proc:
        while not (tmp_path / "dead" / "resume_seed1.npz").exists():
            time.sleep(0.01)
        workers = _workers(proc.pid)
        os.kill(workers[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    (line,) = stderr.strip().splitlines()
    assert re.fullmatch(
        r"rlspeed: the worker process training seed \d ended with exit code -9 \(killed by "
        r"SIGKILL\) in the iteration from env step [\d,]+; resume=\S+/dead continues from env "
        r"step [\d,]+, its last resume point",
        line,
    ), line
    assert _metrics(tmp_path / "dead")["status"] == "FAILED"
    assert _gone(workers)  # the other one too
    _ok(run_cli([*CUT_DQN, "resume=dead", "hydra.run.dir=resumed"], tmp_path))
    _same_run(uninterrupted, tmp_path / "resumed")


FAILING = [
    "task=gym", "task.import=tests.data.failing_envs", "task.id=failing/Corridor-v0",
    "+task.kwargs.fail_at=2000", "algo=ppo", "backend=torch", "env=gym-sync", "num_envs=2",
    "total_steps=20000", "checkpoint_every=0", "progress=none", "tracking=none", "num_seeds=2",
    TWO,
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "said"),
    [
        # The env raises in a worker: the line a run in one process gives.
        (
            "raise",
            "env failing/Corridor-v0 failed in its step (in the iteration from env step "
            "3,840): RuntimeError: the simulator lost its licence",
        ),
        # The env ends the worker's process (os._exit(3)).
        (
            "kill",
            r"the worker process training seed \d ended with exit code 3 in the iteration "
            "from env step 3,840",
        ),
    ],
    ids=["raise", "kill"],
)
def test_a_worker_whose_env_fails_is_one_line(tmp_path, how, said):
    result = run_cli([*FAILING, f"+task.kwargs.how={how}", "hydra.run.dir=run"], tmp_path)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert result.returncode == 1
    expected = "rlspeed: " + (re.escape(said) if how == "raise" else said)
    resume = "; no resume point was written before it (checkpoint_every sets how often)"
    assert re.fullmatch(expected + re.escape(resume), line), line


@pytest.mark.slow
def test_flax_seeds_in_workers_log_and_track_what_seeds_one_after_another_do(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*DQN, "backend=flax", "total_steps=2000", "num_seeds=2", f"tracking.uri={uri}"]
    args = [a for a in args if a != "tracking=none"]
    _ok(run_cli([*args, "tracking.experiment=alone", "hydra.run.dir=alone"], tmp_path))
    _ok(run_cli([*args, TWO, "tracking.experiment=workers", "hydra.run.dir=workers"], tmp_path))
    _same_run(tmp_path / "alone", tmp_path / "workers", seeds=2)
    assert _metrics(tmp_path / "workers")["devices"] == ["cpu:0"]
    client = MlflowClient(tracking_uri=uri)

    def tracked(experiment: str) -> dict[str, list[tuple[int, float]]]:
        (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        names = [name for name in run.data.metrics if name.startswith("seed")]
        return {
            name: sorted(
                (m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)
            )
            for name in names
            if name.rpartition("/")[2] not in ("SPS", "updates_per_second")
        }

    alone, workers = tracked("alone"), tracked("workers")
    assert alone == workers and "seed1/eval/score" in alone
