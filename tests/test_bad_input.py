"""Every kind of bad input is refused before any work: one stderr line naming the key, the bad
value and what is allowed, exit code 2, and nothing created (no outputs/ folder, no MLflow
store, no Optuna journal). Inputs at the edge of what is allowed are still accepted.

The command line's checks run in-process here (``check_command_line``, what ``rlspeed`` runs
before Hydra starts a job); three cases also run through the real command."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium import spaces
from hydra import compose, initialize_config_dir
from optuna.distributions import CategoricalDistribution

from hydra_plugins.rlspeed_optuna_sweeper import config as sweeper_config
from hydra_plugins.rlspeed_optuna_sweeper._bounds import PRUNER_BOUNDS, SAMPLER_BOUNDS
from hydra_plugins.rlspeed_optuna_sweeper._space import build
from hydra_plugins.rlspeed_optuna_sweeper._study import study_name
from rlspeed.cli import CONF_DIR
from rlspeed.errors import ConfigError
from rlspeed.tracking.mlflow import check as check_tracking
from rlspeed.validation import check
from tests.conftest import assert_one_line_error, cli_env, free_port, refused_line, run_cli

# A budget long enough for DQN on Doors to reach its first update (learning_starts 5000).
BUDGET = ["total_steps=6000", "log_every=3000", "eval_every=3000"]
SWEEP = ["-m", "hparams=dqn_search", *BUDGET]
# Optuna searches of one's own (--config-dir conf, as a user writes them): a range outside
# what its key allows, an unparseable range, a key rlspeed does not have.
OWN_SEARCHES = {
    "gamma_beyond_one": "algo.gamma: interval(0.5, 2)",
    "unparseable": "algo.learning_rate: interval(1e-4",
    "unknown_key": "algo.lerning_rate: interval(1e-4, 1e-1)",
}
# A sweep with a journal of its own (hydra.sweeper.storage is set per case).
QLEARN_SWEEP = [
    "-m", "hydra/sweeper=optuna", "algo.alpha=interval(0.1, 0.9)", "algo=qlearn",
    "task=gridworld", "backend=torch", "env=gym-sync", "num_envs=1", "total_steps=500",
]  # fmt: skip
STORAGE = "invalid hydra.sweeper.storage={}: expected a journal file"
CHECKPOINT_EVERY = "auto, 0 (off) or an integer in [1, 2,000,000,000] (env steps)"


class Blind(gym.Env[int, int]):
    """An env with no render modes: nothing can film it."""

    observation_space = spaces.Discrete(2)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        return 0, 0.0, True, False, {}


gym.register("badinput/Blind-v0", entry_point=Blind, max_episode_steps=10)

# (command line, fragments of the one line). tracking=none is added where a case does not
# set tracking.uri; the working folder holds run/ (a run folder as far as the checks look).
BAD = [
    # config groups, types and keys
    (["backend=jax"], ["backend=jax", "flax, torch"]),
    (["env=gym-fast"], ["env=gym-fast", "gym-async, gym-sync, jax-vmap"]),
    (["algo=a2c"], ["algo=a2c", "dqn, ppo, pqn, qlearn, sac, td3, vpg"]),
    (["num_envs=abc"], ["num_envs", "'abc'", "Integer"]),
    (["algo.learning_rate=fast"], ["algo.learning_rate", "'fast'", "Float"]),
    (["algo.optimizer=rmsprop"], ["algo.optimizer=rmsprop", "adam, sgd"]),
    (["no_such_key=1"], ["no_such_key"]),
    (["-m", "backend=torch,jax"], ["backend=jax", "flax, torch"]),
    # what runs with what
    (["algo=td3", "task=cartpole"], ["algo=td3", "discrete actions", "dqn"]),
    (["algo=qlearn", "task=pendulum"], ["algo=qlearn", "td3"]),
    (["algo=qlearn", "task=cartpole"], ["task=cartpole", "a task with a tabular state: doors"]),
    (
        ["algo=ppo", "task=gym", "task.id=Acrobot-v1", "env=jax-vmap"],
        ["env=jax-vmap", "gym-async, gym-sync", "task=gym has no JAX version"],
    ),
    # task settings
    (["task.grid_size=2"], ["invalid task.grid_size=2: expected an integer >= 3"]),
    (["task.n_doors=16"], ["invalid task.n_doors=16: expected an integer in [1, task.grid_size]"]),
    (
        ["algo=qlearn", "task=gridworld", "task.size=1"],
        ["invalid task.size=1: expected an integer"],
    ),
    (["algo=vpg", "task=cartpole", "task.max_steps=0"], ["invalid task.max_steps=0: expected an"]),
    (
        ["algo=td3", "task=pendulum", "task.eval_episodes=0"],
        ["invalid task.eval_episodes=0: expected an integer in [1, 10,000]"],
    ),
    (["seed=-1"], ["invalid seed=-1: expected an integer >= 0"]),
    (["num_seeds=0"], ["invalid num_seeds=0: expected an integer in [1, 65,536]"]),
    # networks, rates and noise on every algorithm
    (["algo.hidden_sizes=[]"], ["invalid algo.hidden_sizes=[]: expected a non-empty list"]),
    (["algo=vpg", "task=cartpole", "algo.hidden_sizes=[0]"], ["invalid algo.hidden_sizes=[0]"]),
    (["algo.learning_starts=-1"], ["invalid algo.learning_starts=-1: expected an integer >= 0"]),
    (["algo.learning_rate=inf"], ["invalid algo.learning_rate=inf: expected a finite number > 0"]),
    (["algo=qlearn", "algo.alpha=0"], ["algo.alpha=0", "(0, 1]"]),
    (
        ["algo=td3", "task=pendulum", "algo.exploration_noise=inf"],
        ["invalid algo.exploration_noise=inf: expected a finite number >= 0"],
    ),
    (
        ["algo=vpg", "task=pendulum", "algo.initial_log_std=nan"],
        ["invalid algo.initial_log_std=nan: expected a finite number"],
    ),
    (
        ["algo=ppo", "task=cartpole", "num_envs=6", "algo.num_minibatches=5"],
        ["invalid algo.num_minibatches=5", "32 * 6 = 192"],
    ),
    # budgets and sizes
    (["num_envs=0"], ["num_envs=0", ">= 1"]),
    (["total_steps=-5"], ["invalid total_steps=-5: expected an integer in [1, 2,000,000,000]"]),
    (["num_envs=64", "total_steps=32"], ["invalid total_steps=32: expected >= num_envs (64)"]),
    (["total_steps=1000"], ["invalid total_steps=1000: expected >= 4993, a budget with a"]),
    (
        ["algo=td3", "task=pendulum", "total_steps=1001", "algo.policy_frequency=16"],
        ["invalid total_steps=1001: expected >= 1009, a budget with 16 gradient updates"],
    ),
    (
        ["num_envs=64", "algo.buffer_size=32", "algo.batch_size=16"],
        ["invalid num_envs=64: expected <= algo.buffer_size (32)"],
    ),
    (
        ["algo.buffer_size=1000000000000"],
        ["invalid algo.buffer_size=1000000000000: expected a size that fits in memory"],
    ),
    (
        ["algo=vpg", "task=cartpole", "num_envs=1000000000", "total_steps=2000000000"],
        ["invalid num_envs=1000000000: expected a size that fits in memory"],
    ),
    (
        ["algo.hidden_sizes=[[1]]"],
        ["invalid algo.hidden_sizes=[[1]]: expected a non-empty list of integers >= 1"],
    ),
    # Submitit accepted it and failed collecting the first job's result, with a traceback.
    (
        ["-m", "seed=1,2", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=-1"],
        ["invalid hydra.launcher.timeout_min=-1: expected an integer >= 1"],
    ),
    # Hydra's line said the sweep "requires --multirun", which it had.
    (
        ["-m", "hparams=qlearn_search", "hydra.sweeper.params.algo.alpha=interval(0.1,0.5)"],
        [
            "invalid override 'hydra.sweeper.params.algo.alpha=interval(0.1,0.5)': a search goes "
            "on the key it searches, expected algo.alpha=interval(0.1,0.5) with -m"
        ],
    ),  # fmt: skip
    # argparse printed its 7-line usage block before its line.
    (["--cfg", "bogus"], ["invalid command line: argument --cfg/-c: invalid choice: 'bogus'"]),
    (["--bogus-flag"], ["invalid command line: unknown option --bogus-flag (see rlspeed --help)"]),
    # A runaway range: 10**10 jobs, which listing alone would take all memory for.
    (
        ["-m", "seed=range(0,10000000000)"],
        ["invalid sweep seed=range(0,10000000000): it makes 10,000,000,000 jobs, expected at"],
    ),
    # Passes over a batch: each a whole batch's work, PPO's orders of the batch kept.
    (
        ["algo=ppo", "task=cartpole", "algo.update_epochs=100000000"],
        ["invalid algo.update_epochs=100000000: expected an integer in [1, 1,000]"],
    ),
    (
        ["algo=vpg", "task=cartpole", "algo.value_iterations=100000000"],
        ["invalid algo.value_iterations=100000000: expected an integer in [1, 1,000]"],
    ),
    (
        ["algo=ppo", "task=cartpole", "algo.update_epochs=1000", "num_envs=100000"]
        + ["algo.num_steps=1000", "algo.num_minibatches=1", "total_steps=100000000"],
        ["invalid algo.update_epochs=1000: expected at most", "for batches of 100,000,000"],
    ),
    # A process per env: 10,000 of them would exhaust memory and the process table.
    (
        ["env=gym-async", "num_envs=10000", "total_steps=20000"],
        ["invalid num_envs=10000: expected at most", "on env=gym-async (a process each"],
    ),
    # folders rlspeed or Hydra would create
    (["hydra.run.dir=/proc/rlspeed/run"], ["invalid hydra.run.dir=/proc/rlspeed/run: expected"]),
    (
        ["-m", "seed=1,2", "hydra.sweep.dir=/proc/rlspeed/sweep"],
        ["invalid hydra.sweep.dir=/proc/rlspeed/sweep: expected a folder rlspeed can create"],
    ),
    (["hydra.run.dir="], ["invalid hydra.run.dir=: expected a folder rlspeed can create"]),
    (
        ["backend=flax", "backend.compilation_cache=/proc/rlspeed-xla"],
        ["backend.compilation_cache=/proc/rlspeed-xla", "create and write"],
    ),
    # resume=, mode=eval, checkpoint= and video=
    (["resume=nowhere"], ["invalid resume=nowhere: expected an existing run folder"]),
    (["resume=."], ["invalid resume=.: expected a run folder (or a file in one) with resume.npz"]),
    (["mode=eval"], ["invalid checkpoint=None: expected a run folder or a checkpoint file"]),
    (["mode=eval", "checkpoint=."], ["invalid checkpoint=.: expected a run folder"]),
    (["mode=test"], ["invalid mode=test: expected one of train, eval"]),
    (["video=a.gif"], ["invalid video=a.gif: expected null unless mode=eval"]),
    (["mode=eval", "checkpoint=run", "resume=run"], ["invalid resume=run: expected null"]),
    (["mode=eval", "checkpoint=run", "video=a.avi"], ["invalid video=a.avi: expected a file"]),
    # A relative path goes into the eval's new folder; an absolute one is written as given.
    (["mode=eval", "checkpoint=run", "video=/proc/no/a.gif"], ["expected a file in an existing"]),
    # video_every=: env steps between videos while training (0 off), of a task filmed here
    (["video_every=-1"], ["invalid video_every=-1: expected 0 (off) or an integer in [1, 2,0"]),
    (["video_every=often"], ["video_every", "'often'", "Integer"]),
    (["mode=eval", "checkpoint=run", "video_every=100"], ["video_every=100: expected 0 with"]),
    (
        ["task=gym", "task.id=badinput/Blind-v0", "env=gym-sync", "video_every=100"],
        [
            "invalid video_every=100: expected 0 (off): task=gym (badinput/Blind-v0) cannot be"
            " filmed here (it draws neither rgb_array nor ansi frames)"
        ],
    ),
    # init_from=: a saved agent this run's networks can take (run/: torch DQN on CartPole)
    (["init_from=nowhere"], ["invalid init_from=nowhere: expected a run folder or a checkpoint"]),
    (["mode=eval", "checkpoint=run", "init_from=run"], ["init_from=run: expected null unless"]),
    (["init_from=run"], ["init_from=run: expected an agent of this run's backend=flax (it was"]),
    (
        ["init_from=run", "backend=torch", "env=gym-sync", "task=cartpole", "algo=ppo"],
        ["invalid init_from=run: expected an agent of this run's algo=ppo (it was trained with"],
    ),
    (
        ["init_from=run", "backend=torch", "env=gym-sync", "task=gridworld"],
        ["init_from=run: expected an agent for this run's observations, Discrete(25", "cartpole"],
    ),
    (
        [
            "init_from=run",
            "backend=torch",
            "env=gym-sync",
            "task=cartpole",
            "algo.hidden_sizes=[8]",
        ],
        ["init_from=run: expected an agent whose arrays fit the networks this run builds"],
    ),
    # sweeps and searches
    (["hparams=dqn_search"], ["invalid hparams=dqn_search without -m: a search runs its"]),
    (["seed=1,2"], ["invalid seed=1,2 without -m"]),
    (["-m", "seed=range(5,5)"], ["invalid override 'seed=range(5,5)': the sweep has no values"]),
    (["-m", "algo.gamma=interval(0.5,0.9)"], ["basic sweeper cannot sample an interval"]),
    (["-m", "no_such_key=1,2"], ["unknown key 'no_such_key'"]),
    ([*SWEEP, "algo.learning_rate=interval(-1,1)"], ["invalid algo.learning_rate=-1.0: expected"]),
    ([*SWEEP, "algo.lerning_rate=interval(0.1,1)"], ["unknown key 'algo.lerning_rate' in the"]),
    (["-m", "hparams=gamma_beyond_one", *BUDGET], ["invalid algo.gamma=2.0: expected a number"]),
    (["-m", "hparams=unparseable"], ["hydra.sweeper.params.algo.learning_rate", "interval(1e-4"]),
    (["-m", "hparams=unknown_key"], ["unknown key 'algo.lerning_rate'", "hydra.sweeper.params"]),
    ([*SWEEP, "hydra/sweeper/sampler=bogus"], ["sampler=bogus", "cmaes, grid, nsgaii"]),
    ([*SWEEP, "hydra/sweeper/pruner=bogus"], ["hydra/sweeper/pruner=bogus", "hyperband, median"]),
    ([*SWEEP, "algo.learning_rate=tag(log, interval(0, 1))"], ["algo.learning_rate", "low > 0"]),
    ([*SWEEP, "algo.learning_rate=interval(1e-4"], ["algo.learning_rate=interval(1e-4"]),
    ([*SWEEP, "hydra.sweeper.direction=sideways"], ["direction=sideways", "maximize or minimize"]),
    (
        [*SWEEP, "hydra.sweeper.direction=[maximize,minimize]"],
        ["objectives=null", "wall_time_s"],
    ),
    (
        [*SWEEP, "hydra.sweeper.direction=[maximize,minimize]", "hydra.sweeper.objectives=[score]"],
        ["objectives=[score]", "expected 2 of score", "direction=[maximize,minimize]"],
    ),
    ([*SWEEP, "hydra.sweeper.objectives=[speed]"], ["objectives=[speed]", "unknown name speed"]),
    (
        [*QLEARN_SWEEP, "hydra.sweeper.storage=/proc/x.journal"],
        [STORAGE.format("/proc/x.journal"), "no file can be created in /proc"],
    ),
    (
        [*QLEARN_SWEEP, "hydra.sweeper.storage=sqlite:////proc/x.db"],
        [STORAGE.format("sqlite:////proc/x.db"), "no file can be created in /proc"],
    ),
    (
        [*QLEARN_SWEEP, "hydra.sweeper.storage=mysql://user@localhost/db"],
        [STORAGE.format("mysql://user@localhost/db"), "driver 'MySQLdb' is not installed"],
    ),
    # psycopg 3 is installed; nothing listens on port 1.
    (
        [*QLEARN_SWEEP, "hydra.sweeper.storage=postgresql://user@127.0.0.1:1/db"],
        [STORAGE.format("postgresql://user@127.0.0.1:1/db"), "the database server does not"],
    ),
    # tracking stores that cannot record
    (["tracking.uri=sqlite:///"], ["expected a database file: sqlite:///RELATIVE.db"]),
    (
        ["tracking.uri=sqlite:////proc/rlspeed/mlflow.db"],
        ["invalid tracking.uri=sqlite:////proc/rlspeed/mlflow.db: expected a database file in"],
    ),
    (["tracking.uri=file:///tmp/mlruns"], ["MLflow 3 refuses file stores"]),
    (["tracking.uri=ftp://host/mlruns"], ["expected a tracking URI MLflow can record to"]),
    (
        ["tracking=tensorboard", "tracking.log_dir=/proc/rlspeed/tb"],
        ["invalid tracking.log_dir=/proc/rlspeed/tb: expected a folder rlspeed can write to"],
    ),
    (
        ["tracking.uri=mysql://user@localhost/mlflow"],
        ["expected a database whose Python driver is installed"],
    ),
    (
        ["tracking.uri=postgresql://user@127.0.0.1:1/mlflow"],
        ["expected a database server that answers"],
    ),
    # accepted once, then failing late or running silently wrong
    (
        ["backend.threads=100000"],
        ["invalid backend.threads=100000: expected auto, or an integer in [0, "],
    ),
    (["backend.device=tpu"], ["invalid backend.device=tpu: expected auto, cpu, cuda or cuda:N"]),
    (["checkpoint_every=-1"], [f"invalid checkpoint_every=-1: expected {CHECKPOINT_EVERY}"]),
    (["checkpoint_every=often"], [f"invalid checkpoint_every=often: expected {CHECKPOINT_EVERY}"]),
    (["checkpoint_every=2000000001"], ["invalid checkpoint_every=2000000001: expected auto"]),
    (["checkpoint_every=1.5"], ["invalid checkpoint_every", "'1.5'"]),
    (
        ["backend=torch", "env=gym-sync", "backend.device=cuda:7"],
        ["invalid backend.device=cuda:7: expected auto or cpu: torch sees"],
    ),
    (
        ["backend=flax", "backend.device=cuda"],
        ["invalid backend.device=cuda: expected auto or cpu: flax sees no GPU"],
    ),
    (
        ["backend=flax", "backend.compilation_cache="],
        ["invalid backend.compilation_cache=: expected a"],
    ),
    (["++bogus=1"], ["unknown key 'bogus' in '++bogus=1'"]),
    (
        [f"total_steps={9 * 10**399}"],
        ["(400 characters): expected an integer in [1, 2,000,000,000]"],
    ),
    (
        ["tracking=mlflow", f"tracking.experiment={'x' * 100_000}"],
        ["(100000 characters): expected a non-empty experiment name of at most 256 characters"],
    ),
    ([*SWEEP, "algo.learning_rate=tag(bogus, interval(0.001, 0.1))"], ["unknown tag 'bogus'"]),
    (
        [*SWEEP, "hydra/sweeper/pruner=hyperband", "hydra.sweeper.pruner.reduction_factor=1"],
        ["invalid hydra.sweeper.pruner.reduction_factor=1: expected an integer in [2, 1,000]"],
    ),
    (
        [*SWEEP, "hydra/sweeper/pruner=hyperband", "hydra.sweeper.pruner.min_resource=0"],
        ["invalid hydra.sweeper.pruner.min_resource=0: expected auto or an integer in [1, "],
    ),
    (
        ["-m", "seed=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"],
        ["invalid hydra.launcher.n_jobs=0: expected an integer in [1, "],
    ),
    (["algo.hidden_sizes=[16777216]"], ["algo.hidden_sizes=[16777216]: expected networks that"]),
    (["task=cartpole", "task.eval_episodes=1000000000"], ["expected an integer in [1, 10,000]"]),
    (["task.max_steps=100000000000"], ["expected an integer in [1, 2,000,000,000]"]),
    ([*SWEEP, "hydra.sweeper.n_jobs=100000"], ["n_jobs=100000: expected an integer in [1, 1,024]"]),
    ([*SWEEP, "hydra.sweeper.batch_size=0"], ["batch_size=0: expected an integer in [1, 1,024]"]),
    ([*SWEEP, f"hydra.sweeper.n_trials={10**12}"], ["expected an integer in [0, 1,000,000]"]),
    (
        [*SWEEP, f"hydra.sweeper.report_every={10**12}"],
        ["expected an integer in [1, 2,000,000,000]"],
    ),
    # malformed command lines
    (["=5"], ["invalid override '=5': expected KEY=VALUE"]),
    (["algo=null"], ["invalid algo=null: expected one of dqn, ppo, pqn, qlearn, sac, td3, vpg"]),
    (["backend="], ["invalid backend=: expected one of flax, torch"]),
    (["-m", "--cfg", "job"], ["expected at most one of --run, --multirun (-m), --cfg"]),
    (["+algo.lerning_rate=0.1"], ["unknown key 'algo.lerning_rate' in '+algo.lerning_rate=0.1'"]),
    (["~algo"], ["invalid override '~algo': rlspeed's keys and config groups cannot be removed"]),
    (["--config-name", "nope"], ["invalid --config-name=nope: expected a config in the config"]),
    (["--config-dir", "/nonexistent"], ["invalid --config-dir=/nonexistent: expected an"]),
    (
        ["env=gym-async", "env.step_timeout_s=0"],
        ["invalid env.step_timeout_s=0.0: expected a number of seconds in (0, 86,400]"],
    ),
    # sizes: an override Hydra's parser would take minutes for, a name no file system takes
    (
        ["algo.hidden_sizes=[" + ",".join(["8"] * 3000) + "]"],
        ["(6001 characters): expected a list or dict of at most 4,096 characters"],
    ),
    (
        ["tracking=tensorboard", "tracking.log_dir=/tmp/" + "x" * 300],
        ["invalid tracking.log_dir=", "a name of 300 bytes, more than 255)"],
    ),
]


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, make_cfg) -> Path:
    """The folder of a finished torch DQN run on CartPole (run in-process, a few steps)."""
    from rlspeed.run import run

    folder = tmp_path_factory.mktemp("cartpole")
    args = ["backend=torch", "env=gym-sync", "task=cartpole", "num_envs=1", "total_steps=100"]
    args += ["algo.learning_starts=50", "tracking=none", "progress=none"]
    with contextlib.chdir(folder):
        run(make_cfg(args))
    return folder


@pytest.fixture
def refusal(tmp_path, monkeypatch, capsys, saved_run):
    """The line the command answers ``args`` with, checked in-process: exit code 2, that one
    stderr line, nothing created in the working folder. The working folder holds ``run/``,
    a finished run's folder (mode=eval reads it back before anything runs); ``conf/``
    beside it holds OWN_SEARCHES, passed as --config-dir."""
    conf = tmp_path / "conf" / "hparams"
    conf.mkdir(parents=True)
    for name, entry in OWN_SEARCHES.items():
        (conf / f"{name}.yaml").write_text(
            "# @package _global_\ndefaults:\n  - override /hydra/sweeper: optuna\n"
            f"hydra:\n  sweeper:\n    params:\n      {entry}\n"
        )
    work = tmp_path / "work"
    shutil.copytree(saved_run, work / "run")
    monkeypatch.chdir(work)
    # The tests choose their own MLflow store; the caller's must not leak in.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def refuse(args: list[str]) -> str:
        before = _files(work)
        line = refused_line(["--config-dir", str(tmp_path / "conf"), *args], capsys)
        assert _files(work) == before, "bad input must create nothing"
        return line

    return refuse


def _case_id(case) -> str:
    args = case.values[0] if hasattr(case, "values") else case[0]
    return " ".join(args)


@pytest.mark.parametrize(("args", "fragments"), BAD, ids=[_case_id(case) for case in BAD])
def test_bad_input_is_one_line_exit_2_nothing_created(refusal, args, fragments):
    tracked = any(arg.startswith("tracking") for arg in args)
    line = refusal(args if tracked else [*args, "tracking=none"])
    for fragment in fragments:
        assert fragment in line, line


def test_unreachable_tracking_server_is_one_line(refusal, monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"
    line = refusal([f"tracking.uri={uri}"])
    assert "tracking.uri" in line and uri in line and "reachable MLflow server" in line
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    line = refusal([])
    assert "MLFLOW_TRACKING_URI" in line and uri in line


# The real command: the same line, exit code 2 and nothing created, on a plain run, a sweep
# and a tracking server that does not answer.
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["num_envs=0", "tracking=none"], ["invalid num_envs=0: expected an integer >= 1"]),
        ([*SWEEP, "algo.learning_rate=interval(-1,1)"], ["invalid algo.learning_rate=-1.0"]),
        (["tracking.uri=http://127.0.0.1:{port}"], ["reachable MLflow server"]),
    ],
    ids=["run", "sweep", "tracking server"],
)
def test_the_command_refuses_with_one_line_and_creates_nothing(tmp_path, args, fragments):
    args = [arg.format(port=free_port()) for arg in args]
    result = run_cli(args, cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert list(tmp_path.iterdir()) == [], "bad input must create nothing"


def test_a_config_error_loads_neither_jax_nor_torch(tmp_path):
    """A typo is answered at start-up cost: the check reads settings, never a backend, an
    env or an array (NumPy alone costs a third of a rejected command's CPU time)."""
    heavy = ("jax", "torch", "flax", "numpy", "gymnasium")
    script = (
        "import sys\n"
        "from rlspeed.cli import main\n"
        "try:\n    main()\n"
        f"finally:\n    print(sorted(m for m in {heavy} if m in sys.modules))"
    )
    for bad in ("num_envs=0", "algo.learning_rate=inf", "task.grid_size=2"):
        result = subprocess.run(
            [sys.executable, "-c", script, bad, "tracking=none"],
            cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert result.stdout.strip() == "[]", (bad, result.stdout)


# --- the edges of what is allowed (in-process: compose + validate) -------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        # the least budget: one step of every env, with an update in it
        ["algo=vpg", "task=cartpole", "num_envs=8", "total_steps=8"],
        ["num_envs=8", "total_steps=8", "algo.learning_starts=0", "algo.train_frequency=1"],
        # DQN's defaults on Doors (128 envs): the first update comes at env step 5004
        ["total_steps=4993"],
        ["algo=td3", "task=pendulum", "total_steps=1001"],
        ["num_envs=64", "algo.buffer_size=64", "algo.batch_size=64", "total_steps=6400"],
        ["seed=0", "task.grid_size=3", "task.n_doors=3", "task.max_steps=1"],
        ["algo=qlearn", "task=gridworld", "task.size=2"],
        ["algo=vpg", "task=pendulum", "algo.initial_log_std=-20", "algo.ent_coef=0"],
        # the largest budget and thread count; a key set with ++ that exists
        ["total_steps=2000000000", f"backend.threads={os.cpu_count()}", "++seed=3"],
        ["checkpoint_every=0"],
        ["checkpoint_every=1"],
        ["checkpoint_every=2000000000"],
        ["task=cartpole", "task.eval_episodes=10000", "algo.hidden_sizes=[4096,4096]"],
    ],
)
def test_inputs_on_the_edge_are_accepted(make_cfg, overrides):
    check(make_cfg([*overrides, "tracking=none"]))


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["total_steps=4992"], "invalid total_steps=4992: expected >= 4993"),
        (["algo=td3", "task=pendulum", "total_steps=1000"], "expected >= 1001"),
        (["num_envs=65", "algo.buffer_size=64", "algo.batch_size=64"], "invalid num_envs=65"),
    ],
)
def test_one_past_the_edge_is_refused(make_cfg, overrides, line):
    with pytest.raises(ConfigError) as error:
        check(make_cfg([*overrides, "tracking=none"]))
    assert line in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["algo.tau=0"], "invalid algo.tau=0.0: expected a number in (0, 1]"),
        (["algo=qlearn", "algo.alpha=0"], "invalid algo.alpha=0.0: expected a number in (0, 1]"),
        (["backend.threads=-1"], "invalid backend.threads=-1: expected auto, or an integer in"),
        (["backend.threads=many"], "invalid backend.threads=many: expected auto, or an integer"),
        (["trial.number=3"], "invalid trial.number=3: expected null outside an Optuna sweep"),
        (["tracking.experiment="], "invalid tracking.experiment=: expected a non-empty"),
    ],
)
def test_settings_that_would_run_silently_wrong_are_refused(make_cfg, overrides, line):
    with pytest.raises(ConfigError) as error:
        check(make_cfg(overrides))
    assert line in str(error.value)


def test_a_sqlite_store_is_checked_without_creating_it(make_cfg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg(["tracking.uri=sqlite:///runs/deep/mlflow.db"])
    check_tracking(cfg.tracking)
    assert list(tmp_path.iterdir()) == []


def _sweeper(overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    return build(cfg.hydra.sweeper, cfg, [])


def test_a_shipped_search_runs_with_any_sampler():
    """dqn_search's multivariate TPE is a sampler option of its own, so choosing another
    sampler replaces it instead of failing on the key `multivariate`."""
    assert _sweeper(["hparams=dqn_search"]).sampler._multivariate
    for name, cls in (("random", "RandomSampler"), ("cmaes", "CmaEsSampler")):
        setup = _sweeper(["hparams=dqn_search", f"hydra/sweeper/sampler={name}"])
        assert type(setup.sampler).__name__ == cls


def test_search_space_extremes_reach_both_ends_and_every_choice():
    space = _sweeper(["hparams=dqn_search"]).space
    lines = {line for overrides in space.extremes() for line in overrides}
    for key, dist in space.distributions.items():
        ends = dist.choices if isinstance(dist, CategoricalDistribution) else (dist.low, dist.high)
        for value in ends:
            assert any(line.startswith(f"{key}=") and line.endswith(str(value)) for line in lines)


# --- hostile sizes and envs (issue 38): task=gym on tests/data/hostile_envs.py ------------

HOSTILE = ["task=gym", "task.import=tests.data.hostile_envs", "backend=torch", "env=gym-sync"]
SIZED = [*HOSTILE, "task.id=hostile/Sized-v0"]
TOO_DEEP = str([8] * 65)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["num_seeds=65537"], "invalid num_seeds=65537: expected an integer in [1, 65,536]"),
        (
            [f"algo.hidden_sizes={TOO_DEEP.replace(' ', '')}"],
            f"invalid algo.hidden_sizes={TOO_DEEP[:30]}... ({len(TOO_DEEP)} characters): "
            "expected a non-empty list of integers >= 1: at most 64 of them, each at most "
            "16,777,216",
        ),
        (
            ["algo.hidden_sizes=[16777217]"],
            "invalid algo.hidden_sizes=[16777217]: expected a non-empty list of integers >= 1: "
            "at most 64 of them, each at most 16,777,216",
        ),
        (
            ["+task.kwargs.box_shape=[0]"],
            "invalid task.id=hostile/Sized-v0: expected an env with Box, Discrete or "
            "MultiDiscrete (from 0) observations of 1 entry or more, not Box([], [], (0,), "
            "float32)",
        ),
        (
            ["+task.kwargs.max_episode_steps=5"],
            "invalid task.kwargs.max_episode_steps=5: expected no such key: rlspeed makes the "
            "env with task.max_steps as its time limit (use task.max_steps=N)",
        ),
        (
            ["+task.kwargs.render_mode=human"],
            "invalid task.kwargs.render_mode=human: expected null, rgb_array or ansi (rlspeed "
            "opens no window; mode=eval video=FILE films the env in a mode of its own)",
        ),
        (
            ["task.id=hostile/Endless-v0"],
            "invalid task.id=hostile/Endless-v0: expected an env whose registered "
            "max_episode_steps is in [1, 100,000] (it registers 1,000,000,000, the length of "
            "its evaluation episodes)",
        ),
        (
            ["task.id=hostile/NoLimit-v0", "task.max_steps=100001"],
            "invalid task.max_steps=100001: expected an integer in [1, 100,000] "
            "(hostile/NoLimit-v0 registers no episode limit: evaluation episodes last "
            "task.max_steps)",
        ),
        (
            ["task.id=hostile/FailingClose-v0"],
            "invalid task.id=hostile/FailingClose-v0: expected an env that closes "
            "(RuntimeError: the simulator's socket is already gone in its close())",
        ),
    ],
    ids=[
        "num_seeds", "hidden layers", "hidden width", "empty Box", "max_episode_steps",
        "render_mode", "registered limit", "unlimited max_steps", "close() raises",
    ],
)  # fmt: skip
def test_hostile_sizes_and_envs_are_one_line(refusal, args, line):
    """The id given last wins: SIZED's is replaced where a case names its own."""
    assert refusal([*SIZED, "algo=dqn", *args, "tracking=none"]) == f"rlspeed: {line}"


def test_networks_and_q_tables_count_what_they_hold(refusal):
    """Sized from this machine's memory: weights alone (the old estimate) fit, the one-hot
    input batch (DQN's 128 rows) or the Q-table's actions and copies do not."""
    from rlspeed.machine import physical_memory

    memory = physical_memory()
    # [64] on one-hot inputs: weights 64 x 16 bytes an input, the batch 128 x 12 bytes.
    entries = memory // 2_000 // 10_000 + 1
    wide = ["+task.kwargs.classes=10000", f"+task.kwargs.entries={entries}"]
    line = refusal([*SIZED, *wide, "algo=dqn", "algo.hidden_sizes=[64]", "tracking=none"])
    assert line.startswith(
        f"rlspeed: invalid algo.hidden_sizes=[64]: expected networks that fit in memory: "
        f"{entries * 10_000:,} inputs make"
    ), line
    # 2**20 states: 4 MiB a column, as many columns as fill memory.
    actions = memory // 2**22 + 1
    table = ["+task.kwargs.classes=1048576", f"+task.kwargs.actions={actions}", "algo=qlearn"]
    line = refusal([*SIZED, *table, "tracking=none"])
    assert line.startswith(
        "rlspeed: invalid task=gym: expected a task whose Q-table fits: at most "
        f"2,147,483,647 states and the memory for them (it has 1,048,576 states x "
        f"{actions:,} actions, 3 copies,"
    ), line


def test_a_video_path_that_names_a_folder_is_one_line(refusal):
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        allowed = ".gif, not a folder (.mp4 needs the imageio-ffmpeg package)"
    else:
        allowed = ".gif, .mp4, not a folder"
    Path("clip.gif").mkdir()
    for video in (str(Path("clip.gif").resolve()), "new.gif/"):
        line = refusal(["mode=eval", "checkpoint=run", f"video={video}", "tracking=none"])
        # A long path is cut in the line: the end says what is allowed.
        assert line.startswith(f"rlspeed: invalid video={video[:30]}"), line
        assert line.endswith(f": expected a file name ending in {allowed}"), line


def test_a_million_seeds_on_gym_async_is_one_line_before_any_folder(tmp_path):
    args = [*SIZED, "env=gym-async", "num_seeds=1000000", "tracking=none"]
    result = run_cli(args, cwd=tmp_path)
    assert_one_line_error(result, "invalid num_seeds=1000000: expected an integer in [1, 65,536]")
    assert list(tmp_path.iterdir()) == [], "bad input must create nothing"


def test_an_env_that_fails_as_it_closes_after_a_run_is_one_line(tmp_path):
    """Its probe closes well (it never stepped); the run's envs do not: exit 1, one line."""
    args = [
        *HOSTILE, "task.id=hostile/FailingCloseLate-v0", "algo=qlearn", "total_steps=100",
        "log_every=50", "eval_every=50", "tracking=none", "progress=none",
    ]  # fmt: skip
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "rlspeed: env hostile/FailingCloseLate-v0 failed in its close after evaluation "
        "episodes (in the iteration from env step 56): RuntimeError: the simulator's socket is "
        "already gone; no resume point was written before it (checkpoint_every sets how often)"
    ]


# --- sweeps: study names, names Hydra makes files of, sampler and pruner numbers --------------
# Through the real command: one line, exit code 2, nothing created (in the working folder nor,
# for a study name with "..", beside it).

LONG = "x" * 100_000
STUDY_NAME = "expected a name of 1 to 200 letters, digits, '_', '-' and '.', not starting"
FILE_NAMES = "expected file and folder names of at most 200 characters (one has 300)"
PRUNER = "hydra.sweeper.pruner"
SWEEP_REFUSALS = [
    ("escaping", ["hydra.sweeper.study_name=../../../up"], [f"name=../../../up: {STUDY_NAME}"]),
    ("empty", ["hydra.sweeper.study_name="], [f"invalid hydra.sweeper.study_name=: {STUDY_NAME}"]),
    ("long", [f"hydra.sweeper.study_name={LONG}"], ["(100000 characters): expected a name of"]),
    ("hidden", ["hydra.sweeper.study_name=.journal"], [f"study_name=.journal: {STUDY_NAME}"]),
    (
        "storage",
        [f"hydra.sweeper.storage={'x' * 300}.journal"],
        ["(308 characters): expected a journal file", "a name in it has 308 characters, more"],
    ),
    (
        "startup trials",
        ["hydra.sweeper.sampler.n_startup_trials=-1"],
        ["sampler.n_startup_trials=-1: expected an integer in [0, 1,000,000]"],
    ),
    (
        "seed",
        [f"hydra.sweeper.sampler.seed={2**32}"],
        ["invalid hydra.sweeper.sampler.seed=4294967296: expected an integer in [0, 4,294,"],
    ),
    (
        "candidates",
        ["hydra.sweeper.sampler.n_ei_candidates=100000000"],
        ["n_ei_candidates=100000000: expected an integer in [1, 10,000]"],
    ),
    (
        "population",
        ["hydra/sweeper/sampler=nsgaii", "hydra.sweeper.sampler.mutation_prob=2"],
        ["invalid hydra.sweeper.sampler.mutation_prob=2.0: expected a number in [0, 1]"],
    ),
    (
        "warmup",
        ["hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_warmup_steps=-1"],
        ["invalid hydra.sweeper.pruner.n_warmup_steps=-1: expected an integer in [0, 2,000,"],
    ),
    (
        "stopping rate",
        ["hydra/sweeper/pruner=successive_halving", f"{PRUNER}.min_early_stopping_rate=31"],
        ["min_early_stopping_rate=31: expected an integer in [0, 30]"],
    ),
    (
        "failure rate",
        ["hydra.sweeper.max_failure_rate=nan"],
        ["invalid hydra.sweeper.max_failure_rate=nan: expected a number in [0, 1]"],
    ),
    (
        "heartbeat",
        ["hydra.sweeper.heartbeat_s=100000"],
        ["invalid hydra.sweeper.heartbeat_s=100000: expected an integer in [1, 3,600]"],
    ),
    (
        "grace",
        ["hydra.sweeper.grace_s=100000000"],
        ["grace_s=100000000: expected an integer in [60, 604,800] (at least 2 * heartbeat_s)"],
    ),
    # A grid lists its points, a shuffled range its values: 10**10 of them took all memory.
    (
        "grid",
        ["hydra/sweeper/sampler=grid", "algo.alpha=0.1,0.2", "seed=range(0,10000000000)"],
        ["invalid hydra/sweeper/sampler=grid: expected a grid of at most 1,000,000 points"],
    ),
    (
        "shuffled range",
        ["seed=shuffle(range(0,10000000000))"],
        ["a shuffled range is a choice of at most 100,000 values"],
    ),
    ("job name", [f"hydra.job.name={'x' * 300}"], ["invalid hydra.job.name=x", FILE_NAMES]),
    ("job folder", [f"hydra.sweep.subdir={'x' * 300}"], ["hydra.sweep.subdir=x", FILE_NAMES]),
    ("its .hydra", [f"hydra.output_subdir={'x' * 300}"], ["hydra.output_subdir=x", FILE_NAMES]),
    # Hydra looks an override's key up as a config group, a folder: "File name too long".
    ("key", [f"+{LONG}=1"], ["invalid override key=xxx", "(100000 characters): expected at most"]),
]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [(args, fragments) for _, args, fragments in SWEEP_REFUSALS],
    ids=[case_id for case_id, _, _ in SWEEP_REFUSALS],
)
def test_a_sweep_setting_out_of_bounds_is_one_line_before_anything_is_created(
    tmp_path, args, fragments
):
    work = tmp_path / "work"
    work.mkdir()
    assert_one_line_error(run_cli([*QLEARN_SWEEP, "tracking=none", *args], cwd=work), *fragments)
    assert list(tmp_path.rglob("*")) == [work], "bad input must create nothing"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([f"+{LONG}=1"], "invalid override key=xxx"),
        ([f"hydra.run.dir=runs/{'x' * 300}"], "invalid hydra.run.dir=runs/x"),
    ],
    ids=["key", "folder"],
)
def test_a_name_too_long_for_a_file_is_one_line_in_a_lone_run(tmp_path, args, fragment):
    result = run_cli([*args, "tracking=none"], cwd=tmp_path)
    assert_one_line_error(result, fragment, "characters")
    assert list(tmp_path.iterdir()) == [], "bad input must create nothing"


SCHEMAS = [
    schema
    for name, schema in vars(sweeper_config).items()
    if name.endswith(("SamplerConfig", "PrunerConfig"))
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[schema.__name__ for schema in SCHEMAS])
def test_every_number_a_sampler_or_pruner_takes_has_bounds(schema):
    bounds = SAMPLER_BOUNDS if schema.__name__.endswith("SamplerConfig") else PRUNER_BOUNDS
    for argument in dataclasses.fields(schema):
        if {int, float} & {*typing.get_args(argument.type), argument.type}:
            assert argument.name in bounds, f"{schema.__name__}.{argument.name} has no bounds"


@pytest.mark.usefixtures("make_cfg")  # registers rlspeed's config schemas
def test_a_sweep_setting_on_its_bounds_is_accepted():
    top = [
        "hydra.sweeper.sampler.n_startup_trials=0",
        f"hydra.sweeper.sampler.seed={2**32 - 1}",
        "hydra.sweeper.sampler.n_ei_candidates=10000",
        "hydra.sweeper.heartbeat_s=3600",
        "hydra.sweeper.grace_s=604800",
        "hydra.sweeper.max_failure_rate=1",
        f"hydra.sweeper.study_name={'x' * 200}",
        "hydra/sweeper/pruner=successive_halving",
        "hydra.sweeper.pruner.min_early_stopping_rate=30",
    ]
    overrides = ["hparams=dqn_search", *top]
    assert _sweeper(overrides).sampler_for is not None  # seeded by default: see _seeding
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    assert study_name(cfg) == "x" * 200
