"""Faults around a sweep's Optuna storage, through the real CLI and real storages.

Concurrent sweeps of one study (another sweep's live trials survive, n_trials is not
overshot), a journal whose last record a full disk cut short, the ``journal:PATH`` form,
storage that cannot be written, and a resumed study's trials (new ones, the same on every
run of the command). Trials are tabular Q-learning on a 5x5 gridworld for 500
steps: the objective hardly matters here, the storage does.
"""

from __future__ import annotations

import json
import resource
import signal
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.rlspeed_optuna_sweeper._trials import (
    HEARTBEAT_ATTR,
    OWNER_ATTR,
    SURPLUS_ATTR,
    is_surplus,
    process_owner,
)
from rlspeed.sweep import open_storage
from tests.conftest import run_cli, start_cli

STUDY = "faults"
SWEEP = [
    "-m",
    "hydra/sweeper=optuna",
    "algo.alpha=interval(0.1, 0.9)",
    f"hydra.sweeper.study_name={STUDY}",
    "algo=qlearn",
    "task=gridworld",
    "backend=torch",
    "env=gym-sync",
    "num_envs=1",
    "total_steps=500",
    "tracking=none",
    "progress=plain",
]


def _trials(spec: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=STUDY, storage=open_storage(spec)).trials


def _states(spec: str) -> list[str]:
    return [t.state.name for t in _trials(spec)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_second_sweep_fails_only_the_trials_whose_sweep_is_gone(tmp_path, kind):
    """RUNNING trials of a concurrent sweep, on this host (a live process) or another (a
    fresh heartbeat), survive; those of a dead process or with an old heartbeat end FAIL."""
    if kind == "journal":  # journal:PATH with an absolute path and a name of one's own
        spec = f"journal:{tmp_path}/studies/faults.log"
    else:
        spec = f"sqlite:///{tmp_path}/studies/faults.db"
    storage = open_storage(spec)
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    live = subprocess.Popen(["sleep", "300"])
    gone = subprocess.Popen(["sleep", "300"])
    try:
        owners = [process_owner(live.pid), process_owner(gone.pid)]
        owners += [{"host": "elsewhere", "pid": 1, "token": "t"}] * 2
        trial_ids = []
        for owner in owners:
            trial_id = study.ask()._trial_id
            storage.set_trial_system_attr(trial_id, OWNER_ATTR, owner)
            if kind == "sqlite":
                storage.record_heartbeat(trial_id)
            else:
                storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
            trial_ids.append(trial_id)
        gone.kill()
        gone.wait()  # its pid is free now: the trial's owner is gone
        # The last trial's host went silent an hour ago.
        if kind == "sqlite":
            with sqlite3.connect(tmp_path / "studies" / "faults.db") as db:
                db.execute(
                    "UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour') "
                    "WHERE trial_id = ?",
                    (trial_ids[3],),
                )
        else:
            storage.set_trial_system_attr(trial_ids[3], HEARTBEAT_ATTR, time.time() - 3600)

        # 2 live + 2 failed count toward n_trials=5: the sweep runs one trial.
        result = run_cli(
            [*SWEEP, f"hydra.sweeper.storage={spec}", "hydra.sweeper.n_trials=5"], cwd=tmp_path
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert _states(spec) == ["RUNNING", "FAIL", "RUNNING", "FAIL", "COMPLETE"]
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()
    log = result.stdout + result.stderr
    assert "Trial(s) [1, 3] were left running by a sweep that is gone: marked FAIL" in log
    assert "2 finished trial(s), 2 running in other sweeps, running 1 more" in log
    # The job attached to its trial through the same storage and reported to it.
    assert _trials(spec)[4].intermediate_values


@pytest.mark.slow
def test_two_sweeps_started_together_run_n_trials_in_all(tmp_path):
    spec = f"{tmp_path}/race.journal"
    args = [*SWEEP, f"hydra.sweeper.storage={spec}", "hydra.sweeper.n_trials=2"]
    with ThreadPoolExecutor(2) as pool:  # two CLI processes at once
        results = list(pool.map(lambda _: run_cli(args, cwd=tmp_path), range(2)))
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    outputs = [result.stdout + result.stderr for result in results]
    trials = _trials(spec)
    ran = [t for t in trials if SURPLUS_ATTR not in t.user_attrs]
    assert [t.state for t in ran] == [TrialState.COMPLETE] * 2
    # Any trial asked for beyond n_trials never ran: FAIL, marked, and no job folder.
    surplus = [t for t in trials if SURPLUS_ATTR in t.user_attrs]
    assert all(t.state == TrialState.FAIL and "output_dir" not in t.user_attrs for t in surplus)
    assert sum(output.count(": COMPLETE, score") for output in outputs) == 2


@pytest.mark.slow
def test_a_journal_cut_short_by_a_full_disk_resumes(tmp_path):
    """A sweep died of a full disk while writing its last record: the same command again
    drops that record (keeping a copy) and resumes with the earlier trials. The relative
    journal:PATH form works too."""
    journal = tmp_path / "studies" / "faults.log"
    storage = open_storage(f"journal:{journal}")
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    sweeper = subprocess.Popen(["sleep", "300"])
    alpha = {"algo.alpha": optuna.distributions.FloatDistribution(0.1, 0.9)}
    for value in (0.25, 0.5):
        trial = study.ask(fixed_distributions=alpha)
        storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, process_owner(sweeper.pid))
        study.tell(trial, value)
    sweeper.kill()
    sweeper.wait()
    before = [(t.params, t.values) for t in study.trials]
    data = journal.read_bytes()
    last = data[data.rstrip(b"\n").rfind(b"\n") + 1 :]  # trial 1's COMPLETE record
    assert b'"trial_id":1' in last
    cut = data[: len(data) - len(last) // 2]
    journal.write_bytes(cut)

    args = [*SWEEP, "hydra.sweeper.storage=journal:studies/faults.log"]
    result = run_cli([*args, "hydra.sweeper.n_trials=3"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ended with a record cut short" in result.stdout + result.stderr
    (backup,) = journal.parent.glob("faults.log.*.broken")
    assert backup.read_bytes() == cut
    after = _trials(f"journal:{journal}")
    # Trial 0 as it was; trial 1 lost only its last record (its sweep is gone: FAIL); one
    # more trial makes n_trials=3.
    assert [t.state.name for t in after] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert [(t.params, t.values) for t in after[:2]] == [before[0], (before[1][0], None)]
    assert journal.read_bytes().startswith(data[: len(data) - len(last)])


@pytest.mark.slow
def test_a_full_disk_under_the_journal_stops_the_sweep_in_one_line_keeping_the_trial(tmp_path):
    """The journal may grow only ~1 kB past its start (RLIMIT_FSIZE, SIGXFSZ ignored: writes
    fail with EFBIG as on a full disk): enough to ask for trial 0, not for its reports nor
    its result. The run trains on unpruned and keeps its results; the sweep stops with one
    line naming what the study lacks and where it is. The same command again repairs the
    journal and goes on."""
    journal = tmp_path / "outputs" / "optuna" / f"{STUDY}.journal"
    storage = open_storage(str(journal))
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    # Named as the sweep names it, so the ~1 kB goes to asking for trial 0.
    study.set_metric_names(["score"])
    # Past the largest file a trial writes (its curve, ~35 kB), which the limit must not stop.
    study.set_user_attr("padding", "x" * 60_000)
    limit = journal.stat().st_size + 1100

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    args = [*SWEEP, "hydra.sweeper.n_trials=2", "log_every=250", "eval_every=250"]
    # The ~1 kB is sized for asking for a sampled trial 0, not for enqueueing the defaults.
    args.append("hydra.sweeper.enqueue_defaults=false")
    with start_cli(args, tmp_path, preexec_fn=small_files) as sweep:
        out, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 1, err[-3000:]
    (trial_dir,) = (tmp_path / "outputs" / "multirun").glob("*/*/0_*")
    assert err.splitlines() == [
        f"rlspeed: sweep stopped: the study's storage {journal} could not record trial 0's "
        f"result (its run's results are in {trial_dir}) (File too large); free some space "
        "and run the same command again"
    ]
    assert "could not record its score at step 250" in out  # the run's report
    metrics = json.loads((trial_dir / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["env_steps"] == 500
    assert (trial_dir / "checkpoint.pt").is_file()

    again = run_cli(args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ended with a record cut short" in again.stdout + again.stderr
    # Trial 0's sweep is gone: FAIL in the study (its results stay in its folder).
    assert _states(str(journal)) == ["FAIL", "COMPLETE"]


@pytest.mark.slow
def test_the_same_command_samples_the_same_trials_and_a_resumed_study_new_ones(tmp_path):
    """The sampler's seed is 0 unless set, and each trial is seeded from it and its number:
    the same command in another folder samples the same trials, and run again it resumes its
    study with trials it has not sampled yet (a sampler seeded once per sweep would start its
    draws again: trials 2 and 3 would repeat 0 and 1), the very ones one longer sweep samples."""
    once, resumed = tmp_path / "once", tmp_path / "resumed"
    for folder, budgets in ((once, [4]), (resumed, [2, 4])):
        folder.mkdir()
        for n_trials in budgets:
            result = run_cli([*SWEEP, f"hydra.sweeper.n_trials={n_trials}"], cwd=folder)
            assert result.returncode == 0, result.stderr[-3000:]

    def alphas(folder: Path) -> list[float]:
        journal = folder / "outputs" / "optuna" / f"{STUDY}.journal"
        return [trial.params["algo.alpha"] for trial in _trials(str(journal))]

    assert alphas(resumed) == alphas(once)
    assert len(set(alphas(once))) == 4


def test_trials_beyond_n_trials_in_the_order_asked_are_surplus():
    def trial(number, state, trial_id=None, **user_attrs):
        value = 0.5 if state == TrialState.COMPLETE else None
        frozen = optuna.trial.create_trial(state=state, value=value, user_attrs=user_attrs)
        frozen.number, frozen._trial_id = number, number if trial_id is None else trial_id
        return frozen

    trials = [
        trial(0, TrialState.COMPLETE),
        trial(1, TrialState.FAIL, **{SURPLUS_ATTR: "not run"}),  # counts for nothing
        trial(2, TrialState.RUNNING),  # another sweep's
        trial(3, TrialState.WAITING),
        trial(4, TrialState.RUNNING),
        trial(5, TrialState.RUNNING),
        trial(5, TrialState.RUNNING, trial_id=6),  # same number (a database server): id next
    ]
    assert [is_surplus(n, trials, n_trials=3) for n in (2, 4, 5, 6)] == [False, False, True, True]
    assert [is_surplus(n, trials, n_trials=4) for n in (5, 6)] == [False, True]


@pytest.mark.parametrize("damage", ["cut", "glued", "zeros"])
def test_only_a_broken_last_journal_record_is_dropped(tmp_path, damage):
    """A record cut short, a record appended to it (what Optuna does next) or a zero-filled
    block (a crash on some file systems): that last line goes, every whole record stays."""
    journal = tmp_path / "study.journal"
    study = optuna.create_study(study_name=STUDY, storage=open_storage(str(journal)))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    whole = journal.read_bytes()
    broken = {
        "cut": whole[:-25],
        "glued": whole[:-25] + b'{"op_code":4,"worker_id":"w","study_id":0}\n',
        "zeros": whole + b"\0" * 4096,
    }[damage]
    journal.write_bytes(broken)
    trials = _trials(str(journal))
    assert len(trials) == 3 and [t.params for t in trials] == [t.params for t in study.trials]
    last_record = whole.rstrip(b"\n").rfind(b"\n") + 1
    assert journal.read_bytes() == (whole if damage == "zeros" else whole[:last_record])
    assert [p.read_bytes() for p in tmp_path.glob("study.journal.*.broken")] == [broken]


@pytest.mark.slow
@pytest.mark.parametrize("keep", [False, True])
def test_finished_trials_drop_their_resume_state_unless_asked_to_keep_it(tmp_path, keep):
    """A finished trial keeps its agent and metrics; its resume state (on Doors the replay
    buffer, ~25 MB a trial) goes unless hydra.sweeper.keep_resume=true, the file a periodic
    checkpoint wrote during the trial too."""
    spec = f"sqlite:///{tmp_path}/study.db"
    args = [*SWEEP, "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage={spec}"]
    args.append("checkpoint_every=100")
    result = run_cli([*args, f"hydra.sweeper.keep_resume={str(keep).lower()}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    folders = [Path(t.user_attrs["output_dir"]) for t in _trials(spec)]
    assert len(folders) == 2
    for folder in folders:
        names = {path.name for path in folder.iterdir()}
        assert {"checkpoint.pt", "metrics.json", "config.yaml"} <= names, names
        assert ("resume.npz" in names) == keep, names
