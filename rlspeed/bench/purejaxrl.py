"""``purejaxrl``: whole processes of PureJaxRL's DQN script (``purejaxrl/dqn.py`` of
github.com/luchris429/purejaxrl, CartPole-v1 through gymnax) against the ``rlspeed`` command
line with the same hyperparameters, timed from process start to exit.

PureJaxRL is not a dependency of rlspeed and none of its code is in this repository: the
benchmark runs a copy of the script that the user saved, with a Python that has gymnax,
flashbax and wandb installed (``--script``, ``--python``; ``HOW_TO_GET`` says how).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, paired_bars, write_results
from rlspeed.bench.peers import ProcessTime, time_process

# The script was written against gymnax's old step API (5 results), which 0.0.9 still has.
HOW_TO_GET = (
    "rlspeed-bench: purejaxrl needs PureJaxRL's DQN script: save purejaxrl/dqn.py of "
    "github.com/luchris429/purejaxrl as /tmp/purejaxrl/dqn.py, make a Python for it "
    "(python3.11 -m venv /tmp/pjx-venv && /tmp/pjx-venv/bin/pip install jax=={jax} "
    "gymnax==0.0.9 flashbax wandb six), then run rlspeed-bench purejaxrl "
    "--script /tmp/purejaxrl/dqn.py --python /tmp/pjx-venv/bin/python"
)

# PureJaxRL's config in main() of dqn.py, and the rlspeed override that matches each entry.
# The run is TOTAL_TIMESTEPS // NUM_ENVS iterations of NUM_ENVS env steps; it updates once
# per iteration (TRAINING_INTERVAL = NUM_ENVS env steps) once more than LEARNING_STARTS
# steps are done. DQNConfig counts the same way: train_frequency and learning_starts in env
# steps, an update for each multiple of train_frequency past learning_starts.
PUREJAXRL_CONFIG = {
    "NUM_ENVS": 10,
    "TOTAL_TIMESTEPS": 500_000,
    "BUFFER_SIZE": 10_000,
    "BUFFER_BATCH_SIZE": 128,
    "LEARNING_STARTS": 10_000,
    "TRAINING_INTERVAL": 10,
    "TARGET_UPDATE_INTERVAL": 500,
    "LR": 2.5e-4,
    "GAMMA": 0.99,
    "TAU": 1.0,
    "EPSILON_START": 1.0,
    "EPSILON_FINISH": 0.05,
    "EPSILON_ANNEAL_TIME": 250_000,
}
RLSPEED_OVERRIDES = [
    "backend=flax",
    "env=jax-vmap",
    "task=cartpole",
    "algo=dqn",
    "num_envs=10",  # NUM_ENVS
    "total_steps=500000",  # TOTAL_TIMESTEPS
    "algo.hidden_sizes=[120,84]",  # QNetwork: Dense(120), Dense(84), Dense(actions)
    "algo.optimizer=adam",
    "algo.learning_rate=0.00025",  # LR
    "algo.anneal_lr=false",  # LR_LINEAR_DECAY: False (rlspeed's CartPole default anneals)
    "algo.buffer_size=10000",  # BUFFER_SIZE
    "algo.batch_size=128",  # BUFFER_BATCH_SIZE
    "algo.gamma=0.99",  # GAMMA
    "algo.tau=1.0",  # TAU
    "algo.target_network_frequency=500",  # TARGET_UPDATE_INTERVAL
    "algo.train_frequency=10",  # TRAINING_INTERVAL
    "algo.learning_starts=10000",  # LEARNING_STARTS
    "algo.start_e=1.0",  # EPSILON_START
    "algo.end_e=0.05",  # EPSILON_FINISH
    "algo.exploration_fraction=0.5",  # EPSILON_ANNEAL_TIME / TOTAL_TIMESTEPS
]

# Runs the script as ``python dqn.py`` does. jax >= 0.6 has no ``jax.tree_map`` (the script
# calls it once, on the target network's initial copy), so it is pointed at ``jax.tree.map``,
# which does the same, when it is missing.
_RUN_SCRIPT = (
    "import runpy, sys, jax\n"
    "if not hasattr(jax, 'tree_map'): jax.tree_map = jax.tree.map\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def purejaxrl_work() -> tuple[int, int]:
    """(env steps, gradient updates) of PureJaxRL's run, from its config as its loop counts:
    iteration i (from 1) ends at env step i * NUM_ENVS and updates when that is past
    LEARNING_STARTS and a multiple of TRAINING_INTERVAL (its buffer holds a batch by then)."""
    total, num_envs, starts, interval = (
        int(PUREJAXRL_CONFIG[key])  # the config's step counts (its other values are floats)
        for key in ("TOTAL_TIMESTEPS", "NUM_ENVS", "LEARNING_STARTS", "TRAINING_INTERVAL")
    )
    iterations = total // num_envs
    ends = (i * num_envs for i in range(1, iterations + 1))
    updates = sum(t > starts and t % interval == 0 for t in ends)
    return iterations * num_envs, updates


def missing_script(script: Path | None) -> str | None:
    """One line saying how to get PureJaxRL's script when ``script`` is not a file."""
    if script is not None and script.is_file():
        return None
    return HOW_TO_GET.format(jax=metadata.version("jax"))


# The rlspeed command as a user types it, and the same without MLflow to show its share.
RLSPEED_VARIANTS = {"rlspeed": [], "rlspeed, tracking=none": ["tracking=none"]}


def run(out_dir: Path, quick: bool, compose: Any, script: Path, python: str | None) -> list[Path]:
    """Time the programs in turns (5 times each, once with ``quick``); write the medians."""
    rlspeed_exe = str(Path(sys.executable).with_name("rlspeed"))
    purejaxrl_cmd = [python or sys.executable, "-c", _RUN_SCRIPT, str(Path(script).resolve())]
    repeats = 1 if quick else 5
    times: dict[str, list[ProcessTime]] = {"purejaxrl": [], **{v: [] for v in RLSPEED_VARIANTS}}
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-purejaxrl-") as tmp:
        # rlspeed runs as a user's repeated command does: in one working directory (its
        # MLflow store, mlflow.db, is created by the first run) with one compilation cache
        # (empty for the first run; later runs load the programs it compiled).
        work = Path(tmp)
        cache = f"backend.compilation_cache={work / 'xla'}"
        for repeat in range(repeats):
            log = work / f"purejaxrl{repeat}.log"
            times["purejaxrl"].append(time_process(purejaxrl_cmd, work, log))
            for index, (label, extra) in enumerate(RLSPEED_VARIANTS.items()):
                run_dir = work / f"run{repeat}_{index}"
                command = [rlspeed_exe, *RLSPEED_OVERRIDES, *extra, cache]
                command.append(f"hydra.run.dir={run_dir}")
                times[label].append(time_process(command, work, run_dir.with_suffix(".log")))
            print(
                f"  repeat {repeat}: "
                + ", ".join(f"{label} {runs[-1].wall_s:.2f} s" for label, runs in times.items()),
                flush=True,
            )
        metrics = json.loads((run_dir / "metrics.json").read_text())
    table = _table(times, (metrics["env_steps"], metrics["gradient_updates"]), repeats)
    table.configs += [
        f"PureJaxRL: {purejaxrl_cmd[0]} -c '<run {script} as __main__>'",
        "PureJaxRL config: " + ", ".join(f"{k}={v}" for k, v in PUREJAXRL_CONFIG.items()),
        *(" ".join(["rlspeed", *RLSPEED_OVERRIDES, *extra]) for extra in RLSPEED_VARIANTS.values()),
    ]
    return write_results(table, out_dir, _plot)


def _table(
    times: dict[str, list[ProcessTime]], rlspeed_work: tuple[int, int], repeats: int
) -> Table:
    table = Table(
        "purejaxrl",
        "DQN on CartPole-v1, whole processes: PureJaxRL's dqn.py against the rlspeed command",
        [
            "program",
            "runs",
            "env_steps",
            "gradient_updates",
            "median_wall_s",
            "min_wall_s",
            "max_wall_s",
            "median_cpu_s",
            "env_steps_per_s",
            "updates_per_s",
            "wall_vs_purejaxrl",
        ],
        notes=[
            "Process time: from starting the process to its exit (interpreter start, imports,"
            " tracing, compiling, training, and for rlspeed its evaluations, MLflow tracking,"
            " checkpoint and outputs). CPU time: user + system over the process's life.",
            f"The programs ran in turns, {repeats} times each; medians. rlspeed's first run"
            " starts with an empty compilation cache and a new MLflow store (row 'rlspeed, first"
            " run'); later runs load its compiled programs, as a user's next run of the command"
            " does. PureJaxRL's script has no compilation cache.",
            "rlspeed runs its default command line with PureJaxRL's hyperparameters: flax +"
            " jax-vmap (fused), tracking=mlflow (the default, a local sqlite store),"
            " backend.threads=auto (1 here), greedy evaluation every 50,000 steps, progress"
            " lines. The tracking=none row leaves MLflow out.",
            "PureJaxRL's env steps and updates follow from its config (its loop updates once per"
            " iteration past LEARNING_STARTS); rlspeed's are what its last run reported.",
        ],
    )
    pjx_median = statistics.median(t.wall_s for t in times["purejaxrl"])
    rows = [(label, runs) for label, runs in times.items()]
    rows.insert(2, ("rlspeed, first run", times["rlspeed"][:1]))
    for label, runs in rows:
        steps, updates = purejaxrl_work() if label == "purejaxrl" else rlspeed_work
        wall = statistics.median(t.wall_s for t in runs)
        table.add(
            program=label,
            runs=len(runs),
            env_steps=steps,
            gradient_updates=updates,
            median_wall_s=wall,
            min_wall_s=min(t.wall_s for t in runs),
            max_wall_s=max(t.wall_s for t in runs),
            median_cpu_s=statistics.median(t.cpu_s for t in runs),
            env_steps_per_s=steps / wall,
            updates_per_s=updates / wall,
            wall_vs_purejaxrl=wall / pjx_median,
        )
    return table


def _plot(table: Table, ax: Any) -> None:
    paired_bars(
        ax,
        [row["program"].replace(", ", "\n") for row in table.rows],
        ("wall (process start to exit)", [r["median_wall_s"] for r in table.rows]),
        ("CPU (user + sys)", [r["median_cpu_s"] for r in table.rows]),
    )
    for i, row in enumerate(table.rows):
        ax.annotate(
            f"{row['wall_vs_purejaxrl']:.2f}x",
            (i - 0.2, row["median_wall_s"]),  # over the wall-time bar
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("seconds (median)")
    ax.legend(fontsize=8)
