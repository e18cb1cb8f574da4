"""Which RUNNING trials of a study are alive, and how many trials a study still needs.

Several sweeps may work on one study at once (two terminals, a job array on a cluster). A
trial is RUNNING from the moment a sweeper asks for it until that sweeper tells how its job
ended, and only that sweeper can tell it: a RUNNING trial is alive as long as its sweeper
process is (the job runs inside it, or in a worker it waits on). So:

* the sweeper records itself as a trial's owner when it asks for it (``OWNER_ATTR``: host,
  pid and a start token, so that a reused pid does not pass for the owner);
* while the trial's job runs, a heartbeat thread of the sweeper marks the trial alive every
  ``hydra.sweeper.heartbeat_s`` seconds: Optuna's heartbeats on a database (RDBStorage), a system
  attribute (``HEARTBEAT_ATTR``) in a journal file;
* a RUNNING trial is stale, and is marked FAIL, when its owner is on this host and gone, or
  its owner is on another host and its last heartbeat is older than
  ``hydra.sweeper.grace_s``. A trial with no owner (asked for by an older rlspeed or another
  program) is stale once it has run that long (a sweeper records the owner just after
  asking: the grace covers that).

A study should get ``n_trials`` trials in all, whichever sweeps run them. Counted are the
finished trials and the live RUNNING ones; a sweeper asks only for what is left, holding the
study's lock while it counts and asks (rlspeed.sweep.database_lock: an advisory lock on
PostgreSQL and MySQL; a journal file or SQLite serializes writes by itself). Another program, or two
sweeps that count at the same time without the lock, may still both ask for the last trial,
so each checks right after asking: trials count in the order of their numbers, and a trial
beyond the first ``n_trials`` counted is surplus. A surplus trial never runs; Optuna cannot delete a
trial, so it is told FAIL with the user attribute ``SURPLUS_ATTR`` saying why (samplers
ignore failed trials) and is left out of every count. As trials are numbered in the order
they were asked for, a sweeper that finds its trial within the first ``n_trials`` sees
every trial that could come before it. On a database server without the lock two trials
asked for in the same instant can get the same number, or the one with the lower id can be
committed later; their order is then (number, id), and such a pair could overshoot
``n_trials`` by one: the lock is what rules that out there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import fail_stale_trials
from optuna.trial import FrozenTrial, TrialState

log = logging.getLogger(__name__)

OWNER_ATTR = "rlspeed:owner"
HEARTBEAT_ATTR = "rlspeed:heartbeat"
SURPLUS_ATTR = "surplus"
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)


def _start_token(pid: int) -> str | None:
    """Boot id and start time of process ``pid`` (Linux), or None if it has exited."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # fields from the 3rd on (the name may hold spaces)
    if fields[0] in ("Z", "X"):  # a zombie: exited, not yet reaped
        return None
    return f"{boot}:{fields[19]}"  # field 22: start time, in clock ticks since boot


def process_owner(pid: int) -> dict[str, Any]:
    """The owner record of process ``pid`` of this host."""
    return {"host": socket.gethostname(), "pid": pid, "token": _start_token(pid)}


def _owner_alive(owner: dict[str, Any]) -> bool | None:
    """Whether the owner process runs; None if it is on another host."""
    if owner.get("host") != socket.gethostname():
        return None
    if owner.get("token") is not None:
        return _start_token(owner["pid"]) == owner["token"]
    try:  # no /proc where the owner was recorded: whether the pid exists is all one knows
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age_s(trial: FrozenTrial) -> float:
    """Seconds since the trial's last sign of life (heartbeat attribute, else its start)."""
    beat = trial.system_attrs.get(HEARTBEAT_ATTR)
    if beat is not None:
        return time.time() - beat
    if trial.datetime_start is None:
        return float("inf")
    return (datetime.now() - trial.datetime_start).total_seconds()


def counted(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that count toward ``n_trials``: finished or RUNNING, surplus ones left out."""
    return [t for t in trials if t.state in COUNTED and SURPLUS_ATTR not in t.user_attrs]


def is_surplus(trial_id: int, trials: list[FrozenTrial], n_trials: int) -> bool:
    """Whether trial ``trial_id`` comes after the first ``n_trials`` counted trials, in the
    order they were asked for (number, then id: see the module's note on databases)."""

    def order(trial: FrozenTrial) -> tuple[int, int]:
        return trial.number, trial._trial_id

    mine = order(next(t for t in trials if t._trial_id == trial_id))
    return sum(order(t) < mine for t in counted(trials)) >= n_trials


class TrialKeeper:
    """Records this sweeper as the owner of the trials it asks for, keeps them alive while
    their jobs run, and fails the stale RUNNING trials of the study."""

    def __init__(self, study: Any, storage: Any, heartbeat_s: float, grace_s: float) -> None:
        self.study = study
        self.storage = storage
        self.heartbeat_s = heartbeat_s
        self.grace_s = grace_s
        self.owner = process_owner(os.getpid())
        # A database records Optuna's heartbeats (open_storage turned them on); a journal
        # file has none: the heartbeat is a trial system attribute there.
        self.db_heartbeats = isinstance(storage, optuna.storages.RDBStorage)
        self._beating: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlspeed-heartbeat", daemon=True)
        self._thread.start()

    def claim(self, trial: Any) -> None:
        """Make ``trial`` (just asked for) this sweeper's and start its heartbeat."""
        self._beat(trial._trial_id)  # first, so no sweeper sees it ownerless and beatless
        self.storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, self.owner)
        with self._lock:
            self._beating.add(trial._trial_id)

    def release(self, trial: Any) -> None:
        """Stop the heartbeat of ``trial`` (about to be told how it ended)."""
        with self._lock:
            self._beating.discard(trial._trial_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                trial_ids = list(self._beating)
            for trial_id in trial_ids:
                try:
                    self._beat(trial_id)
                except optuna.exceptions.UpdateFinishedTrialError:
                    pass  # told meanwhile
                except Exception as error:  # noqa: BLE001 - a lost beat must not end the sweep
                    log.warning("Heartbeat of trial id %d not recorded: %s", trial_id, error)

    def _beat(self, trial_id: int) -> None:
        if self.db_heartbeats:
            self.storage.record_heartbeat(trial_id)
        else:
            self.storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def fail_stale(self) -> list[int]:
        """Mark the study's stale RUNNING trials FAIL; returns their numbers."""
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running:
            return []
        with warnings.catch_warnings():  # "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            fail_stale_trials(self.study)  # a database's heartbeats, whoever the owner
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if self._is_stale(trial):
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    self.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        states = {t.number: t.state for t in self.study.get_trials(deepcopy=False)}
        stale = [t.number for t in running if states[t.number] == TrialState.FAIL]
        if stale:
            log.warning("Trial(s) %s were left running by a sweep that is gone: marked FAIL", stale)
        return stale

    def _is_stale(self, trial: FrozenTrial) -> bool:
        owner = trial.system_attrs.get(OWNER_ATTR)
        if owner is None:
            return _age_s(trial) > self.grace_s
        alive = _owner_alive(owner)
        if alive is not None:
            return not alive
        # Another host: its database heartbeats were judged by fail_stale_trials above.
        return not self.db_heartbeats and _age_s(trial) > self.grace_s

    def mark_surplus(self, trial: Any, n_trials: int) -> None:
        """Say why a trial that must not run (is_surplus) ends FAIL; the caller tells it."""
        self.release(trial)
        trial.set_user_attr(
            SURPLUS_ATTR,
            f"not run: another sweep of the study had asked for its n_trials={n_trials} first",
        )
