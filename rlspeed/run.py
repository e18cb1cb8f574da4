"""One training run: build the parts named by the config, train, record everything."""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from rlspeed.config import RunConfig, flatten, to_yaml, validate
from rlspeed.engines import Engine, EngineSpec
from rlspeed.monitor import RECENT_EPISODES, RunMonitor, SeedMonitor
from rlspeed.registry import ALGOS, BACKENDS, ENGINES, TASKS, TRACKERS
from rlspeed.sweep import TrialReporter
from rlspeed.tasks import TaskSpec
from rlspeed.tracking import Tracker

log = logging.getLogger("rlspeed")


@dataclass
class TrainResult:
    steps: int
    updates: int


@dataclass
class RunContext:
    """What an algorithm's ``train(ctx)`` gets: the config, the task, the engine, the
    monitor, and which of the run's ``num_seeds`` agents it trains."""

    cfg: RunConfig  # plain dataclasses, not DictConfig (see ``run``)
    task: TaskSpec
    engine: EngineSpec
    run_monitor: RunMonitor
    out_dir: Path
    seed_index: int = 0
    # True on the fused path, where one program trains every seed at once.
    all_seeds: bool = False
    # Per seed index: writes that agent's checkpoint and returns its path (set by the
    # algorithm once the agent exists; called when the run ends, however it ends).
    checkpointers: dict[int, Callable[[], Path]] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.cfg.seed + self.seed_index

    @property
    def monitor(self) -> SeedMonitor:
        return SeedMonitor(self.run_monitor, self.seed_index)

    def make_engine(self) -> Engine:
        cfg = self.cfg
        return self.engine.make(self.task, cfg.task, cfg.env, cfg.num_envs, self.seed)

    def set_checkpoint(self, name: str, save: Callable[[Path], Path]) -> None:
        """Register ``save(path)`` as this agent's checkpoint, file ``name`` in the run folder
        (``<stem>_seed<i><suffix>`` when agents of several seeds are saved one by one)."""
        path = self.out_dir / name
        if self.cfg.num_seeds > 1 and not self.all_seeds:
            path = path.with_name(f"{path.stem}_seed{self.seed_index}{path.suffix}")
        self.checkpointers[self.seed_index] = lambda: save(path)

    def each_seed(self, train_one: Callable[[RunContext], TrainResult]) -> TrainResult:
        """Train the ``num_seeds`` agents one after another (the host-driven paths)."""
        steps = updates = 0
        for index in range(self.cfg.num_seeds):
            seed_ctx = replace(self, seed_index=index)
            BACKENDS.get(self.cfg.backend.name).setup(self.cfg.backend, seed_ctx.seed)
            result = train_one(seed_ctx)
            steps, updates = steps + result.steps, updates + result.updates
        return TrainResult(steps, updates)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _output_dir() -> Path:
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def run(cfg: DictConfig) -> float:
    """Train as configured; returns the task's score (greedy evaluation)."""
    validate(cfg)
    algo, task = ALGOS.get(cfg.algo.name), TASKS.get(cfg.task.name)
    engine = ENGINES.get(cfg.env.name)
    BACKENDS.get(cfg.backend.name).setup(cfg.backend, cfg.seed)
    train = algo.load(cfg.backend.name)

    out_dir = _output_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(to_yaml(cfg))
    choices = {
        "backend": cfg.backend.name,
        "env": cfg.env.name,
        "algo": cfg.algo.name,
        "task": cfg.task.name,
    }
    reporter = TrialReporter.attach(cfg)  # None unless the run is an Optuna trial
    run_name, tags = "-".join(choices.values()), dict(choices)
    if reporter is not None:
        run_name += f"-trial{cfg.trial.number}"
        tags.update({"optuna.study": cfg.trial.study_name, "optuna.trial": str(cfg.trial.number)})
    tracker = TRACKERS.get(cfg.tracking.name).make(cfg.tracking)
    tracker.start(run_name=run_name, params=flatten(cfg), tags=tags)
    # The training loops read the config on every step: as the schema's dataclasses an
    # attribute costs ~30 ns, through DictConfig ~10 us (18% of a CartPole DQN run).
    plain_cfg = OmegaConf.to_object(cfg)
    monitor = RunMonitor(
        tracker,
        cfg.total_steps,
        cfg.eval_every,
        evaluate=lambda policy, index: task.evaluate(
            plain_cfg.task, policy, plain_cfg.seed + index
        ),
        progress=cfg.progress,
        on_score=reporter.report if reporter is not None else None,
        num_seeds=cfg.num_seeds,
    )
    ctx = RunContext(plain_cfg, task, engine, monitor, out_dir)
    # optuna.TrialPruned for a trial run; () matches nothing, so other runs never import optuna.
    pruned_error = reporter.pruned_error if reporter is not None else ()
    status = "FAILED"
    # A scheduler's SIGTERM (preemption, `timeout`) ends the run like Ctrl-C: KILLED, checkpointed.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGTERM, _interrupt) if in_main_thread else None
    try:
        result = train(ctx)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        log.warning("rlspeed: interrupted; saving a checkpoint and the metrics recorded so far")
        raise
    except pruned_error as pruned:
        # Stopped by the study's pruner: the sweeper records the trial as PRUNED.
        status = "KILLED"
        tracker.set_tags({"optuna.pruned": "true"})
        log.info("rlspeed: trial %d %s", cfg.trial.number, pruned)
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
        monitor.close()
        _finish(tracker, ctx, status)
    _summary(choices, monitor, result, tracker.run_id, out_dir)
    return monitor.score


def _finish(tracker: Tracker, ctx: RunContext, status: str) -> None:
    """Write outputs and close the tracked run; runs even when training failed."""
    out_dir = ctx.out_dir
    artifacts = [out_dir / "config.yaml"]
    monitor = ctx.run_monitor
    try:
        artifacts += [save() for save in ctx.checkpointers.values()]
        if monitor.history:
            artifacts.append(_write_metrics(monitor, out_dir, status))
            artifacts.append(_plot_curve(monitor, out_dir))
        for path in artifacts:
            tracker.log_artifact(path)
    finally:
        tracker.end(status)


def _write_metrics(monitor: RunMonitor, out_dir: Path, status: str) -> Path:
    final = monitor.history[-1]
    summary = {
        "status": status,
        "num_seeds": monitor.num_seeds,
        # Means over seeds where num_seeds > 1; per-seed values under "seeds".
        "score": monitor.score,
        "rolling_step_reward": monitor.rolling_step_reward,
        "recent_return": monitor.recent_return,
        # Summed over seeds: agent-steps and updates of all agents together.
        "env_steps": monitor.steps,
        "gradient_updates": monitor.updates,
        "wall_time_s": monitor.wall_time,
        "env_steps_per_s": monitor.steps / monitor.wall_time,
        "updates_per_s": monitor.updates / monitor.wall_time,
        "final": final,
    }
    if monitor.num_seeds > 1:
        summary["seeds"] = [
            {
                "score": stream.score,
                "rolling_step_reward": stream.rolling_step_reward,
                "recent_return": stream.recent_return,
                "env_steps": stream.steps,
            }
            for stream in monitor.streams
        ]
    path = out_dir / "metrics.json"
    path.write_text(json.dumps(summary, indent=2, allow_nan=True))
    return path


def _plot_curve(monitor: RunMonitor, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Returns and per-step ratios live on different scales: one panel each.
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    panels = (
        (left, "charts/episodic_return", "episodic return (training)"),
        (right, "charts/rolling_step_reward", "rolling step reward (training)"),
        (right, "eval/score", "score (greedy evaluation)"),
    )
    for ax, name, label in panels:
        rows = [row for row in monitor.history if name in row]
        if rows:
            steps = np.array([row["step"] for row in rows])
            values = np.array([row[name] for row in rows])
            marker = "o" if name == "eval/score" else None
            ax.plot(steps, values, marker=marker, label=label)
            if monitor.num_seeds > 1:
                spread = np.array([row[f"{name}_std"] for row in rows])
                ax.fill_between(steps, values - spread, values + spread, alpha=0.2)
    for ax in (left, right):
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
        ax.legend()
    seeds = f" (mean ± std over {monitor.num_seeds} seeds)" if monitor.num_seeds > 1 else ""
    fig.suptitle(f"learning curve{seeds}")
    fig.tight_layout()
    path = out_dir / "learning_curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _summary(
    choices: dict[str, str],
    monitor: RunMonitor,
    result: TrainResult,
    run_id: str | None,
    out_dir: Path,
) -> None:
    table = Table(title="rlspeed run", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for key, value in choices.items():
        table.add_row(key, value)
    wall = monitor.wall_time
    seeds = f" (mean of {monitor.num_seeds} seeds)" if monitor.num_seeds > 1 else ""
    for key, value in (
        ("seeds", str(monitor.num_seeds)),
        ("env steps", f"{result.steps:,}"),
        ("gradient updates", f"{result.updates:,}"),
        ("wall time", f"{wall:.1f} s"),
        ("env steps/s", f"{result.steps / wall:,.0f}"),
        ("updates/s", f"{result.updates / wall:,.0f}"),
        (f"score{seeds}", f"{monitor.score:.4f}"),
        ("rolling step reward", f"{monitor.rolling_step_reward:.4f}"),
        (f"return, last {RECENT_EPISODES} episodes", f"{monitor.recent_return:.2f}"),
        ("MLflow run id", run_id or "-"),
        ("outputs", str(out_dir)),
    ):
        table.add_row(key, value)
    Console().print(table)
