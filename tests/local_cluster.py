"""A throwaway one-node SLURM cluster on this machine, with accounting, PostgreSQL and MLflow.

``LocalCluster(folder)`` starts, each on its own free loopback ports and files, so that two
clusters can run side by side (pytest-xdist):

* munged (its own key and socket) for SLURM's authentication;
* a MariaDB server and slurmdbd, so that ``sacct`` answers (submitit polls job states with it);
* slurmctld and one slurmd (node ``n<port>``, partition ``debug``);
* a PostgreSQL server with role ``rlspeed`` owning databases ``optuna`` and ``mlflow``;
* an ``mlflow server`` backed by the ``mlflow`` database, serving artifacts.

Every daemon stops when the ``with`` block ends, whatever happened. For people::

    python -m tests.local_cluster up DIR    # start in the background, print the exports and URLs
    python -m tests.local_cluster down DIR  # stop what `up DIR` started
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

PARTITION = "debug"
URGENT_PARTITION = "urgent"  # preempts the jobs of PARTITION (PreemptMode=REQUEUE)
# Every daemon's environment carries this variable (the cluster's folder): stopping a cluster
# kills exactly the processes that carry it, and their descendants (slurmstepd's job tasks).
MARKER = "RLSPEED_LOCAL_CLUSTER"
SLURM_BINARIES = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sbatch", "sacct")
MLFLOW = str(Path(sys.executable).with_name("mlflow"))


class ClusterError(RuntimeError):
    """A daemon of the local cluster did not start (the message names it and quotes its log)."""


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL's bin folder (initdb, postgres, psql), if installed."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    newest = max(found, key=lambda path: int(path.split("/")[4]), default=None)
    return Path(newest).parent if newest else None


def unavailable() -> str | None:
    """Why this machine cannot run a LocalCluster (one line), or None when it can."""
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (its daemons run as root, munge and postgres)"
    missing = [name for name in SLURM_BINARIES if shutil.which(name) is None]
    if postgres_bin() is None:
        missing.append("/usr/lib/postgresql/*/bin/initdb")
    if not Path(MLFLOW).exists():
        missing.append(MLFLOW)
    if missing:
        return (
            f"the local SLURM cluster needs {', '.join(missing)} (Debian: apt-get install "
            "slurm-wlm slurmdbd munge postgresql mariadb-server)"
        )
    return None


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file (or a note that there is none)."""
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _processes() -> dict[int, tuple[int, bytes]]:
    """Every process on the machine: pid -> (parent pid, raw environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found[int(entry.name)] = (parent, (entry / "environ").read_bytes())
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
    return found


def cluster_pids(folder: Path) -> set[int]:
    """The processes of the cluster in ``folder``: its daemons and everything they started."""
    procs = _processes()
    tag = f"{MARKER}={folder}".encode()
    pids = {pid for pid, (_, environ) in procs.items() if tag in environ.split(b"\0")}
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in procs.items():
        children.setdefault(parent, []).append(pid)
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in pids:
                pids.add(child)
                todo.append(child)
    # Never this process nor its ancestors (a shell that ran `up` and then `down`).
    pid = os.getpid()
    while pid > 1 and pid in procs:
        pids.discard(pid)
        pid = procs[pid][0]
    return pids


def stop_cluster(folder: Path, runtime: Path, timeout: float = 10) -> None:
    """SIGKILL every process of the cluster in ``folder``, wait until they are gone, and
    remove its ``runtime`` folder."""
    deadline = time.monotonic() + timeout
    while pids := cluster_pids(folder):
        if time.monotonic() > deadline:
            raise ClusterError(
                f"processes {sorted(pids)} of the cluster in {folder} outlive SIGKILL"
            )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    shutil.rmtree(runtime, ignore_errors=True)


class LocalCluster:
    """A one-node SLURM cluster, PostgreSQL and MLflow server living in ``folder``.

    Use it as a context manager; the attributes are set once it has started:

    * ``env``: environment variables to merge into a subprocess's for the SLURM client
      commands (sbatch, squeue, sacct, scontrol, scancel) to reach this cluster;
    * ``partition``: the partition's name;
    * ``optuna_url`` / ``mlflow_db_url``: SQLAlchemy URLs of the two PostgreSQL databases;
    * ``mlflow_uri``: the MLflow tracking server's address.

    The sockets (slurmstepd's among them, in slurmd's spool) and the files of the daemons
    that run as their own users (munged, postgres) live in a side folder, ``runtime``, under
    /tmp: a socket's path must stay under 108 bytes, which pytest-xdist's ``tmp_path`` exceeds
    (slurmstepd then dies at launch), and munge and postgres cannot enter ``tmp_path``.
    """

    def __init__(self, folder: Path | str, timeout: float = 60, cpus: int | None = None) -> None:
        self.folder = Path(folder).resolve()
        self.timeout = timeout
        # At least 4 CPU slots, even on 2 cores (slurmd then trusts slurm.conf), so that a
        # 2-worker sweep and a test's own job can run at once.
        self.cpus = cpus or max(4, os.cpu_count() or 1)
        self.partition = PARTITION
        self.runtime = Path(tempfile.mkdtemp(prefix="rlspeed-cluster-", dir="/tmp"))
        self.runtime.chmod(0o755)
        self.ports = {
            name: free_port()
            for name in ("slurmctld", "slurmd", "slurmdbd", "mariadb", "postgres", "mlflow")
        }
        self.node = f"n{self.ports['slurmd']}"
        self.conf = self.folder / "slurm" / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        pg = self.ports["postgres"]
        self.optuna_url = f"postgresql+psycopg://rlspeed@127.0.0.1:{pg}/optuna"
        self.mlflow_db_url = f"postgresql+psycopg://rlspeed@127.0.0.1:{pg}/mlflow"
        self.mlflow_uri = f"http://127.0.0.1:{self.ports['mlflow']}"
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- start-up -------------------------------------------------------------------------

    def start(self) -> None:
        """Start every daemon, in dependency order, overlapping the slow ones."""
        slurm = self.folder / "slurm"
        munge, mariadb = self._start_munge(), self._start_mariadb()
        initdb = self._start_initdb()
        self._wait("munged", munge, lambda: Path(self.munge_socket).exists())
        self._wait("mariadbd", mariadb, lambda: port_open(self.ports["mariadb"]))
        self._write_slurm_conf()
        self._spawn("slurmdbd", ["slurmdbd", "-D"], slurm / "slurmdbd.log")
        self._wait("slurmdbd", slurm / "slurmdbd.log", lambda: port_open(self.ports["slurmdbd"]))
        self._spawn("slurmctld", ["slurmctld", "-D"], slurm / "slurmctld.log")
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node], slurm / "slurmd.log")
        self._start_postgres(initdb)
        self._start_mlflow()
        self._wait("slurmd", slurm / "slurmd.log", self._node_idle)
        self._wait("slurmdbd", slurm / "slurmdbd.log", self._sacct_answers)
        self._wait("mlflow server", self.folder / "mlflow" / "server.log", self._mlflow_healthy)

    def _spawn(
        self,
        name: str,
        args: list[str],
        log: Path,
        user: str | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        """Start one daemon in its own session, its output in ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, **(env_extra or {}), MARKER: str(self.folder)}
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                user=user,
                group=user,
                extra_groups=[] if user else None,
            )
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, log: Path, ready: Callable[[], bool]) -> None:
        """Poll ``ready`` until it holds; fail naming the daemon if it exits or times out."""
        deadline = time.monotonic() + self.timeout
        proc = self.procs.get(name)
        while not ready():
            if proc is not None and proc.poll() is not None:
                raise ClusterError(f"{name} exited ({proc.returncode}); {log} ends:\n{tail(log)}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{name} did not start within {self.timeout:g} s; {log} ends:\n{tail(log)}"
                )
            time.sleep(0.1)

    def _own(self, name: str, user: str) -> Path:
        """A folder of ``runtime`` owned by ``user``, which only it may list or write."""
        path = self.runtime / name
        path.mkdir()
        path.chmod(0o711)  # munged wants its socket's folder searchable by all
        shutil.chown(path, user, user)
        return path

    @property
    def munge_socket(self) -> str:
        return str(self.runtime / "munge" / "socket")

    def _start_munge(self) -> Path:
        folder = self._own("munge", "munge")
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        shutil.chown(key, "munge", "munge")
        # In the foreground munged logs to stderr, which is this log.
        log = folder / "munged.log"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--seed-file={folder / 'munged.seed'}",
            ],
            log,
            user="munge",
        )
        return log

    def _start_mariadb(self) -> Path:
        # No grant tables: an empty data folder starts in a second (no mariadb-install-db),
        # and slurmdbd connects as any user. It listens on loopback only.
        folder = self.folder / "mariadb"
        (folder / "data").mkdir(parents=True)
        log = folder / "mariadbd.log"
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={folder / 'data'}",
                "--user=root",
                f"--socket={self.runtime / 'mariadb.sock'}",
                f"--port={self.ports['mariadb']}",
                "--bind-address=127.0.0.1",
                "--skip-grant-tables",
                "--skip-name-resolve",
                f"--pid-file={folder / 'mariadbd.pid'}",
                f"--log-error={log}",
                "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=0",
                "--innodb-doublewrite=0",
            ],
            log,
        )
        return log

    def _write_slurm_conf(self) -> None:
        slurm = self.folder / "slurm"
        (slurm / "state").mkdir(parents=True)
        p = self.ports
        # The daemons log to stderr (-D), into the files _spawn gives them.
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}"
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        self.conf.write_text(f"""\
ClusterName=rlspeed
SlurmctldHost=localhost
SlurmctldPort={p["slurmctld"]}
SlurmUser=root
SlurmdUser=root
{auth},cred_expire=5
StateSaveLocation={slurm / "state"}
SlurmdSpoolDir={self.runtime / "spool"}
SlurmctldPidFile={slurm / "slurmctld.pid"}
SlurmdPidFile={slurm / "slurmd.pid"}
MailProg=/bin/true
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={p["slurmdbd"]}
AccountingStoragePass={self.munge_socket}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
# A job of the urgent partition preempts debug's jobs that hold the CPUs it needs: SLURM
# sends them SIGTERM and requeues them, killing them GraceTime (+ KillWait) seconds later.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
MpiDefault=none
NodeName={self.node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p["slurmd"]} \
CPUs={self.cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 \
GraceTime=60
PartitionName={URGENT_PARTITION} Nodes={self.node} MaxTime=INFINITE State=UP PriorityTier=2
""")
        dbd = slurm / "slurmdbd.conf"
        dbd.touch(mode=0o600)  # slurmdbd refuses a readable one (it could hold a password)
        dbd.write_text(f"""\
{auth}
DbdHost=localhost
DbdPort={p["slurmdbd"]}
SlurmUser=root
PidFile={slurm / "slurmdbd.pid"}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={p["mariadb"]}
StorageUser=root
StorageLoc=slurm_acct_db
""")

    def _start_initdb(self) -> subprocess.Popen:
        folder = self._own("postgres", "postgres")
        # Any local connection may log in as any role: a throwaway server on loopback.
        args = [str(postgres_bin() / "initdb"), "-D", str(folder / "data"), "-U", "postgres"]
        args += ["--auth=trust", "--no-sync", "--locale=C", "--encoding=UTF8"]
        return self._spawn("initdb", args, folder / "initdb.log", user="postgres")

    def _start_postgres(self, initdb: subprocess.Popen) -> None:
        folder = self.runtime / "postgres"
        try:
            status = initdb.wait(self.timeout)
        except subprocess.TimeoutExpired:
            status = None
        if status != 0:
            log = folder / "initdb.log"
            raise ClusterError(f"initdb failed ({status}); {log} ends:\n{tail(log)}")
        log = folder / "postgres.log"
        port = str(self.ports["postgres"])
        # Loopback only; a throwaway database need not survive a crash (no fsync).
        settings = ["listen_addresses=127.0.0.1", "fsync=off", "synchronous_commit=off"]
        args = [str(postgres_bin() / "postgres"), "-D", str(folder / "data"), "-p", port]
        args += ["-k", str(folder), *(arg for setting in settings for arg in ("-c", setting))]
        self._spawn("postgres", args, log, user="postgres")
        ready = [str(postgres_bin() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", port]
        self._wait("postgres", log, lambda: subprocess.run(ready).returncode == 0)
        psql = [str(postgres_bin() / "psql"), "-h", "127.0.0.1", "-p", port, "-U", "postgres"]
        psql += ["-q", "-v", "ON_ERROR_STOP=1", "-c", "CREATE ROLE rlspeed LOGIN"]
        psql += ["-c", "CREATE DATABASE optuna OWNER rlspeed"]
        psql += ["-c", "CREATE DATABASE mlflow OWNER rlspeed"]
        created = subprocess.run(psql, capture_output=True, text=True)
        if created.returncode != 0:
            raise ClusterError(f"creating the rlspeed role and databases failed: {created.stderr}")

    def _start_mlflow(self) -> None:
        # Without job execution: it starts seven more processes (GenAI jobs) nothing here uses.
        folder = self.folder / "mlflow"
        args = [MLFLOW, "server", "--backend-store-uri", self.mlflow_db_url, "--workers", "1"]
        args += ["--serve-artifacts", "--artifacts-destination", str(folder / "artifacts")]
        args += ["--host", "127.0.0.1", "--port", str(self.ports["mlflow"])]
        no_jobs = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._spawn("mlflow server", args, folder / "server.log", env_extra=no_jobs)

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "--noheader", "-n", self.node, "-o", "%t", check=False)
        return out.stdout.strip() == "idle"

    def _sacct_answers(self) -> bool:
        return self.run("sacct", "--noheader", "-X", "-j", "1", check=False).returncode == 0

    def _mlflow_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.mlflow_uri}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    # --- use and shut-down ----------------------------------------------------------------

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client command (sbatch, squeue, ...) against this cluster."""
        done = subprocess.run(
            args, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=60
        )
        if check and done.returncode != 0:
            raise ClusterError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def squeue(self) -> list[dict[str, str]]:
        """The queue: one dict per job with its job_id, name, state and reason (or nodes)."""
        out = self.run("squeue", "--noheader", "-o", "%i|%j|%T|%R").stdout
        keys = ("job_id", "name", "state", "reason")
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines()]

    def sacct_states(self, job_id: str | int) -> dict[str, str]:
        """Accounting's state of a job and of its steps: {"12": "COMPLETED", "12.batch": ...}.

        The state's first word only ("CANCELLED by 0" -> "CANCELLED"); a requeued job shows its
        latest run."""
        out = self.run("sacct", "--noheader", "--parsable2", "-o", "JobID,State", "-j", str(job_id))
        return {
            job: state.split()[0]
            for job, state in (line.split("|") for line in out.stdout.splitlines())
        }

    @property
    def pids(self) -> dict[str, int]:
        """The process ids of the daemons running now, by name."""
        return {name: proc.pid for name, proc in self.procs.items() if proc.poll() is None}

    def describe(self) -> dict[str, object]:
        """What `up` writes to cluster.json: the addresses, the folders and the daemons' pids."""
        return {
            "folder": str(self.folder),
            "runtime": str(self.runtime),
            "env": self.env,
            "partition": self.partition,
            "optuna_url": self.optuna_url,
            "mlflow_db_url": self.mlflow_db_url,
            "mlflow_uri": self.mlflow_uri,
            "pids": self.pids,
        }

    def stop(self) -> None:
        """Kill every daemon and job of this cluster and remove the side folder."""
        stop_cluster(self.folder, self.runtime)
        for proc in self.procs.values():
            proc.wait()  # reap them, or they linger as zombies of this process


def main(argv: list[str] | None = None) -> int:
    """``up DIR`` / ``down DIR``: start a cluster that outlives this command, or stop it."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.local_cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("folder", type=Path, help="the cluster's folder (created by up)")
    args = parser.parse_args(argv)
    folder = args.folder.resolve()
    if args.action == "down":
        described = json.loads((folder / "cluster.json").read_text())
        stop_cluster(folder, Path(described["runtime"]))
        print(f"stopped the cluster in {folder}")
        return 0
    if reason := unavailable():
        print(f"local_cluster: {reason}", file=sys.stderr)
        return 1
    if folder.exists() and any(folder.iterdir()):
        print(f"local_cluster: {folder} is not empty: `up` needs a new folder", file=sys.stderr)
        return 1
    folder.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(folder)
    start = time.monotonic()
    try:
        cluster.start()
    except BaseException as error:
        cluster.stop()
        if not isinstance(error, ClusterError):
            raise
        print(f"local_cluster: {error}", file=sys.stderr)
        return 1
    (folder / "cluster.json").write_text(json.dumps(cluster.describe(), indent=2) + "\n")
    print(
        f"# cluster up in {time.monotonic() - start:.1f} s; stop it with: "
        f"python -m tests.local_cluster down {folder}"
    )
    print(f"export SLURM_CONF={cluster.conf}")
    print(f"# partition: {cluster.partition}\n# optuna storage: {cluster.optuna_url}")
    print(f"# mlflow: {cluster.mlflow_uri} (database {cluster.mlflow_db_url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
