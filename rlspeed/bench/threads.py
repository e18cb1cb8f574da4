"""``threads``: torch on a machine it shares, and torch DQN against CleanRL's ``dqn.py``.

Shared machine: TD3 on Hopper-v5 and DQN on CartPole (torch + gym-sync), each with
``backend.threads`` 1 and 0 (one per core), quiet and beside one busy process (a Python loop
that keeps one core busy, as a second run or a notebook would). The rate is the gradient
updates per second of the run's logged intervals once updates have started (their median),
so start-up and the random steps before ``learning_starts`` are left out; ``kept`` is the
busy rate over the quiet one, the share of its speed a run keeps beside another program.

With ``--cleanrl``: CleanRL's ``cleanrl/dqn.py`` at its defaults (CartPole-v1, one env, 500k
steps) against the ``rlspeed`` command with the same hyperparameters, whole processes at
equal env steps and updates (``rlspeed.bench.peers``).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, paired_bars, write_results
from rlspeed.bench.overhead import timed_rlspeed
from rlspeed.bench.peers import (
    Peers,
    Side,
    Workload,
    config_lines,
    missing_peers,
    peer_table,
    peer_versions,
    plot_workloads,
    process_time_note,
    rlspeed_side,
    run_workloads,
    verdicts,
)
from rlspeed.validation import auto_threads

# case -> (overrides, total_steps quick, total_steps full): the pair's settings, updates
# from step 1,000 on TD3 (its Hopper settings wait 25,000 random steps).
CASES: dict[str, tuple[list[str], int, int]] = {
    "td3-hopper": (
        ["algo=td3", "task=gym", "task.id=Hopper-v5", "algo.learning_starts=1000"],
        1_300,
        2_500,
    ),
    # Updates from step 5,000 on, one per env step.
    "dqn-cartpole": (["algo=dqn", "task=cartpole"], 6_000, 10_000),
}
STACK = ["backend=torch", "env=gym-sync", "tracking=none"]
SHARED_COLUMNS = [
    "case", "threads", "runs", "quiet_updates_per_s", "busy_updates_per_s", "kept",
]  # fmt: skip
# A core kept busy: what one other program on the machine does.
BUSY_LOOP = "while True: pass"

# CleanRL's DQN defaults (Args of cleanrl/dqn.py): every one given on its command line.
CLEANRL_DQN: dict[str, Any] = {
    "learning-rate": 2.5e-4, "num-envs": 1, "buffer-size": 10_000, "gamma": 0.99,
    "tau": 1.0, "target-network-frequency": 500, "batch-size": 128, "start-e": 1.0,
    "end-e": 0.05, "exploration-fraction": 0.5, "learning-starts": 10_000,
    "train-frequency": 10,
}  # fmt: skip


def run(
    out_dir: Path,
    quick: bool,
    compose: Any,
    peers: Peers | None = None,
    repeats: int | None = None,
) -> list[Path]:
    paths = shared_machine(out_dir, quick, compose, repeats or (1 if quick else 3))
    peers = peers or Peers()
    left_out = missing_peers(peers, ("cleanrl",))
    for line in left_out:
        print(f"rlspeed-bench threads: {line}", flush=True)
    if not left_out:
        paths += against_cleanrl(out_dir, quick, peers, repeats or (1 if quick else 5))
    return paths


def update_rate(metrics: dict[str, Any]) -> float:
    """The median updates/s of the run's logged intervals that were updating throughout
    (the first with updates in it began before them)."""
    rates = [row["charts/updates_per_second"] for row in metrics["history"]]
    updating = [rate for rate in rates if rate > 0][1:]
    if not updating:
        raise RuntimeError("rlspeed-bench threads: the run logged no interval of updates")
    return statistics.median(updating)


def _rate(overrides: list[str], folder: Path, run_dir: Path, busy: bool) -> float:
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    try:
        return update_rate(timed_rlspeed(overrides, folder, run_dir))
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()


def shared_machine(out_dir: Path, quick: bool, compose: Any, repeats: int) -> list[Path]:
    table = Table(
        "threads",
        "torch on a shared machine: updates/s quiet and beside one busy process",
        SHARED_COLUMNS,
        notes=[
            "updates/s: the median over the run's logged intervals after updates began"
            f" (charts/updates_per_second), then the median over {repeats} round(s); each"
            " round runs every variant quiet, then beside the busy process.",
            f"busy process: `{sys.executable} -c '{BUSY_LOOP}'`, one core kept busy,"
            " started before the run and killed after it.",
            "kept: busy_updates_per_s / quiet_updates_per_s.",
            "(auto): the threads backend.threads=auto picks for the case.",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-threads-") as tmp:
        folder = Path(tmp)
        for case, (overrides, quick_steps, steps) in CASES.items():
            total = quick_steps if quick else steps
            base = [*STACK, *overrides, f"total_steps={total}", f"log_every={total // 20}"]
            picked = auto_threads(compose(base))
            table.configs += [f"rlspeed {' '.join(base)} backend.threads={t}" for t in (1, 0)]
            rates: dict[tuple[int, bool], list[float]] = {}
            for repeat in range(repeats):
                for threads in (1, 0):
                    for busy in (False, True):
                        run_dir = folder / f"{case}-{threads}-{busy}-{repeat}"
                        command = [*base, f"backend.threads={threads}"]
                        rate = _rate(command, folder, run_dir, busy)
                        rates.setdefault((threads, busy), []).append(rate)
                        print(f"  {case} threads={threads} busy={busy}: {rate:.1f} updates/s")
            for threads in (1, 0):
                quiet = statistics.median(rates[threads, False])
                busy_rate = statistics.median(rates[threads, True])
                label = "1" if threads else "0 (one per core)"
                table.add(
                    case=case,
                    threads=label + (" (auto)" if threads == picked else ""),
                    runs=repeats,
                    quiet_updates_per_s=quiet,
                    busy_updates_per_s=busy_rate,
                    kept=busy_rate / quiet,
                )
    return write_results(table, out_dir, plot_shared)


def plot_shared(table: Table, ax: Any) -> None:
    labels = [f"{row['case']}\nthreads={row['threads']}" for row in table.rows]
    paired_bars(
        ax,
        labels,
        ("quiet", [row["quiet_updates_per_s"] for row in table.rows]),
        ("beside a busy process", [row["busy_updates_per_s"] for row in table.rows]),
    )
    ax.set_ylabel("gradient updates/s")
    ax.legend()


def dqn_workload(total: int) -> Workload:
    """CleanRL's dqn.py at its defaults for ``total`` env steps and the rlspeed command doing
    the same work: an update every 10th env step after 10,000 (CleanRL: global_step >
    learning_starts and global_step % 10 == 0, counting from 0)."""
    dqn = CLEANRL_DQN
    every, starts = dqn["train-frequency"], dqn["learning-starts"]
    updates = (total - 1) // every - starts // every
    flags = [f"--{key}={value}" for key, value in dqn.items()]
    script = ("cleanrl/dqn.py", "--env-id=CartPole-v1", f"--total-timesteps={total}", "--seed=1")
    rlspeed = [
        "backend=torch", "env=gym-sync", "algo=dqn", "task=cartpole", "num_envs=1",
        f"total_steps={total}", f"eval_every={total}", "algo.hidden_sizes=[120,84]",
        f"algo.learning_rate={dqn['learning-rate']}", "algo.anneal_lr=false",
        f"algo.buffer_size={dqn['buffer-size']}", f"algo.gamma={dqn['gamma']}",
        f"algo.target_network_frequency={dqn['target-network-frequency']}",
        f"algo.batch_size={dqn['batch-size']}", f"algo.start_e={dqn['start-e']}",
        f"algo.end_e={dqn['end-e']}", f"algo.exploration_fraction={dqn['exploration-fraction']}",
        f"algo.learning_starts={starts + every}", f"algo.train_frequency={every}",
    ]  # fmt: skip
    return Workload(
        "dqn-cartpole-cleanrl",
        (
            Side("CleanRL dqn.py", "cleanrl", (*script, *flags), (total, updates)),
            rlspeed_side("rlspeed torch gym-sync", rlspeed),
        ),
        f"CleanRL's dqn.py settings on Gymnasium's CartPole-v1, {total:,} env steps, one env,"
        " 120-84 network, an update every 10th step after 10,000 (Adam 2.5e-4, not annealed),"
        " target copied every 500 steps, epsilon 1 -> 0.05 over half the run; one evaluation"
        " at the end.",
    )


def against_cleanrl(
    out_dir: Path, quick: bool, peers: Peers, repeats: int, total: int | None = None
) -> list[Path]:
    """The DQN pair: CleanRL's 500,000 steps (``total`` to choose; quick: 30,000)."""
    chosen = [dqn_workload(total or (30_000 if quick else 500_000))]
    outcomes, first = run_workloads(chosen, peers, repeats, quick)
    table = peer_table(
        "threads_cleanrl_dqn",
        "torch DQN, whole processes: CleanRL's dqn.py against the rlspeed command",
        chosen,
        outcomes,
        first,
    )
    table.notes += [
        process_time_note("CleanRL's script writes TensorBoard logs and prints every episode."),
        f"The programs ran in turns, {repeats} time(s) each, forward then backward; medians.",
        "return: the mean of the last 20 training episodes.",
        *verdicts(table, {"rlspeed torch": ("CleanRL", 1.0)}),
    ]
    table.notes += peer_versions(peers, ("cleanrl",))
    table.configs += config_lines(chosen, peers)
    return write_results(table, out_dir, plot_workloads)
