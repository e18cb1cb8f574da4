"""``searches``: every shipped search space against the defaults it starts from.

For each ``conf/hparams`` search, one default run (``rlspeed algo=<its algo> task=<its
task>``, what the same command without ``-m`` and the search trains) and the sweep as it
ships (``rlspeed -m hparams=<search>``), each a whole process from start to exit in a fresh
folder (its own MLflow store, study journal and compilation cache, tracking on as users run
it). A search should reach at least the default's score, and the report says in how many
times the default's wall time it did (the stated multiple). ``--quick``: fewer trials and
fewer env steps per trial (the default run gets the same steps), the same seed.

The table is written after each search, so a long run keeps what it measured.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, paired_bars, write_results
from rlspeed.bench.overhead import timed_rlspeed
from rlspeed.bench.sweep import sweep_process
from rlspeed.sweep import study_value

# Every shipped search, cheapest first, with --quick's budget: (trials, env steps per trial,
# env steps between a trial's reports to the pruner), each a multiple of the search's
# rollout batch.
QUICK: dict[str, tuple[int, int, int]] = {
    "qlearn_search": (8, 102_400, 25_600),
    "ppo_float_search": (6, 20_480, 10_240),
    "dqn_search": (4, 50_000, 12_500),
    "pqn_search": (4, 100_000, 50_000),
    "vpg_search": (4, 61_440, 30_720),
    "ppo_search": (4, 20_480, 10_240),
    "td3_search": (4, 6_000, 3_000),
    "sac_search": (4, 6_000, 3_000),
}
COLUMNS = [
    "search",
    "algo",
    "task",
    "total_steps",
    "trials",
    "complete",
    "pruned",
    "default_score",
    "default_s",
    "trial0_score",
    "best_score",
    "best_trial",
    "sweep_s",
    "time_ratio",
    "best_ge_default",
]


def shipped_searches() -> list[str]:
    """The ``conf/hparams`` options, in QUICK's order (a new one last)."""
    from rlspeed.cli import CONF_DIR

    shipped = sorted(path.stem for path in (Path(CONF_DIR) / "hparams").glob("*.yaml"))
    return [name for name in QUICK if name in shipped] + [n for n in shipped if n not in QUICK]


def default_process(overrides: Sequence[str], folder: Path) -> tuple[float, dict[str, Any]]:
    """One ``rlspeed`` run in a fresh process in ``folder``, as ``sweep_process`` runs a
    sweep: its whole-process seconds and its metrics.json."""
    folder.mkdir(parents=True)
    cache = f"backend.compilation_cache={folder / 'xla'}"
    metrics = timed_rlspeed([*overrides, cache], folder, folder / "run")
    return metrics["process_s"], metrics


def reached(best: float | None, default_score: float) -> str:
    """Whether a study's best (rounded as the study records values) is at least the default
    run's score, rounded the same way."""
    return "yes" if best is not None and best >= study_value(default_score) else "no"


def trial_scores(trials: list[dict[str, Any]]) -> dict[int, float]:
    """Each finished trial's score by its number (``sweep_process``'s trials)."""
    scores = {}
    for trial in trials:
        number = next(o for o in trial["overrides"] if o.startswith("trial.number="))
        if trial["metrics"] is not None and trial["metrics"].get("score") is not None:
            scores[int(number.split("=", 1)[1])] = float(trial["metrics"]["score"])
    return scores


def run(out_dir: Path, quick: bool, compose: Any, only: Sequence[str] | None = None) -> list[Path]:
    searches = list(only) if only else shipped_searches()  # the CLI checked the names
    table = Table(
        "searches",
        "Each shipped search against the default run of its algo and task"
        + (" (quick)" if quick else ""),
        COLUMNS,
        notes=[
            "default_s, sweep_s: whole processes from start to exit (tracking=mlflow, the"
            " default; a fresh folder, MLflow store, study and compilation cache each), run"
            " one after another. time_ratio: sweep_s / default_s, the multiple of the"
            " default's wall time the search took.",
            "default_score: the default run's score (greedy evaluation, the task's standard"
            " settings); trial0_score: the sweep's trial 0, the same defaults"
            " (hydra.sweeper.enqueue_defaults) trained with the sweep's report interval;"
            " best_score: the study's best (best_trial its number); best_ge_default: whether"
            " best_score >= default_score, both rounded to the 6 significant digits a study"
            " records.",
            "quick: each search's n_trials, total_steps and report_every set as in its"
            " command line below (the default run with the same total_steps); otherwise"
            " the searches' shipped budgets.",
        ],
    )
    paths: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-searches-") as tmp:
        for search in searches:
            cfg = compose([f"hparams={search}"])
            stack = [f"algo={cfg.algo.name}", f"task={cfg.task.name}"]
            steps, sweep_args = [], [f"hparams={search}"]
            if quick and search in QUICK:
                n_trials, total_steps, report_every = QUICK[search]
                steps = [f"total_steps={total_steps}"]
                sweep_args += [f"hydra.sweeper.n_trials={n_trials}", *steps]
                sweep_args.append(f"hydra.sweeper.report_every={report_every}")
            table.configs.append("rlspeed " + " ".join(stack + steps))
            table.configs.append("rlspeed -m " + " ".join(sweep_args))
            default_s, default = default_process(stack + steps, Path(tmp) / f"{search}-default")
            sweep = sweep_process(sweep_args, Path(tmp) / f"{search}-sweep")
            scores = trial_scores(sweep["trials"])
            states = [t["metrics"]["status"] for t in sweep["trials"] if t["metrics"]]
            best = sweep["best_value"]
            table.add(
                search=search,
                algo=cfg.algo.name,
                task=cfg.task.name,
                total_steps=default["env_steps"],
                trials=len(sweep["trials"]),
                complete=states.count("FINISHED"),
                pruned=states.count("KILLED"),
                default_score=default["score"],
                default_s=default_s,
                trial0_score=scores.get(0, float("nan")),
                best_score=float("nan") if best is None else float(best),
                best_trial="–" if sweep["best_trial"] is None else sweep["best_trial"],
                sweep_s=sweep["process_s"],
                time_ratio=sweep["process_s"] / default_s,
                best_ge_default=reached(best, default["score"]),
            )
            paths = write_results(table, out_dir, plot_searches)
    return paths


def plot_searches(table: Table, ax: Any) -> None:
    """Each search's sweep and default run, whole-process seconds (log scale), with whether
    the search reached the default's score."""
    labels = [
        f"{row['search']}\n{'≥' if row['best_ge_default'] == 'yes' else '<'} default"
        for row in table.rows
    ]
    paired_bars(
        ax,
        labels,
        ("default run", [row["default_s"] for row in table.rows]),
        ("sweep", [row["sweep_s"] for row in table.rows]),
    )
    ax.set_yscale("log")
    ax.set_ylim(bottom=1)
    ax.set_ylabel("seconds, whole process")
    ax.tick_params(axis="x", labelsize=6, rotation=30)
    ax.legend(fontsize=8)
