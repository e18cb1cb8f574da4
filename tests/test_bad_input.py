"""Every kind of bad input is refused before any work: one stderr line naming the key, the bad
value and what is allowed, exit code 2, and nothing created (no outputs/ folder, no MLflow
store, no Optuna journal). Inputs at the edge of what is allowed are still accepted."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from optuna.distributions import CategoricalDistribution

from hydra_plugins.rlspeed_optuna_sweeper._space import build
from rlspeed.cli import CONF_DIR
from rlspeed.config import validate
from rlspeed.errors import ConfigError
from rlspeed.tracking.mlflow import check as check_tracking
from tests.conftest import assert_one_line_error, run_cli

# A budget long enough for DQN on Doors to reach its first update (learning_starts 5000).
BUDGET = ["total_steps=6000", "log_every=3000", "eval_every=3000"]
SWEEP = ["-m", "hparams=dqn_search", *BUDGET]
# A search space of one's own (--config-dir), as a user writes it.
OWN_SEARCH = """\
# @package _global_
defaults:
  - override /hydra/sweeper: optuna
hydra:
  sweeper:
    params:
      algo.gamma: interval(0.5, 2)
"""

BAD = [
    # task settings
    (["task.grid_size=2"], "invalid task.grid_size=2: expected an integer >= 3"),
    (["task.n_doors=16"], "invalid task.n_doors=16: expected an integer in [1, task.grid_size]"),
    (
        ["algo=qlearn", "task=gridworld", "task.size=1"],
        "invalid task.size=1: expected an integer >= 2",
    ),
    (["algo=vpg", "task=cartpole", "task.max_steps=0"], "invalid task.max_steps=0: expected an"),
    (
        ["algo=td3", "task=pendulum", "task.eval_episodes=0"],
        "invalid task.eval_episodes=0: expected an integer >= 1",
    ),
    (["seed=-1"], "invalid seed=-1: expected an integer >= 0"),
    # networks, rates and noise on every algorithm
    (["algo.hidden_sizes=[]"], "invalid algo.hidden_sizes=[]: expected a non-empty list"),
    (["algo=vpg", "task=cartpole", "algo.hidden_sizes=[0]"], "invalid algo.hidden_sizes=[0]"),
    (["algo.learning_starts=-1"], "invalid algo.learning_starts=-1: expected an integer >= 0"),
    (["algo.learning_rate=inf"], "invalid algo.learning_rate=inf: expected a finite number > 0"),
    (
        ["algo=td3", "task=pendulum", "algo.exploration_noise=inf"],
        "invalid algo.exploration_noise=inf: expected a finite number >= 0",
    ),
    (
        ["algo=vpg", "task=pendulum", "algo.initial_log_std=nan"],
        "invalid algo.initial_log_std=nan: expected a finite number",
    ),
    # budgets and sizes
    (["num_envs=64", "total_steps=32"], "invalid total_steps=32: expected >= num_envs (64)"),
    (["total_steps=1000"], "invalid total_steps=1000: expected >= 4993, a budget with a gradient"),
    (
        ["algo=td3", "task=pendulum", "total_steps=1001", "algo.policy_frequency=16"],
        "invalid total_steps=1001: expected >= 1009, a budget with 16 gradient updates",
    ),
    (
        ["num_envs=64", "algo.buffer_size=32", "algo.batch_size=16"],
        "invalid num_envs=64: expected <= algo.buffer_size (32)",
    ),
    (
        ["algo.buffer_size=1000000000000"],
        "invalid algo.buffer_size=1000000000000: expected a size that fits in memory",
    ),
    (
        ["algo=vpg", "task=cartpole", "num_envs=1000000000000", "total_steps=10000000000000"],
        "invalid num_envs=1000000000000: expected a size that fits in memory",
    ),
    # folders Hydra would create
    (["hydra.run.dir=/proc/rlspeed/run"], "invalid hydra.run.dir=/proc/rlspeed/run: expected a"),
    (
        ["-m", "seed=1,2", "hydra.sweep.dir=/proc/rlspeed/sweep"],
        "invalid hydra.sweep.dir=/proc/rlspeed/sweep: expected a folder rlspeed can create",
    ),
    # sweeps
    (["hparams=dqn_search"], "invalid hparams=dqn_search without -m: a search runs its trials"),
    (["seed=1,2"], "invalid seed=1,2 without -m"),
    (["-m", "seed=range(5,5)"], "invalid override 'seed=range(5,5)': the sweep has no values"),
    (["-m", "algo.gamma=interval(0.5,0.9)"], "basic sweeper cannot sample an interval"),
    (["-m", "no_such_key=1,2"], "unknown key 'no_such_key'"),
    ([*SWEEP, "algo.learning_rate=interval(-1,1)"], "invalid algo.learning_rate=-1.0: expected a"),
    ([*SWEEP, "algo.lerning_rate=interval(0.1,1)"], "unknown key 'algo.lerning_rate' in the"),
    (
        ["-m", "hparams=gamma_beyond_one", *BUDGET],
        "invalid algo.gamma=2.0: expected a number in [0, 1]",
    ),
    # malformed command lines
    (["=5"], "invalid override '=5': expected KEY=VALUE"),
    (["algo=null"], "invalid algo=null: expected one of dqn, ppo, qlearn, td3, vpg"),
    (["backend="], "invalid backend=: expected one of flax, torch"),
    (["-m", "--cfg", "job"], "expected at most one of --run, --multirun (-m), --cfg"),
    (["+algo.lerning_rate=0.1"], "unknown key 'algo.lerning_rate' in '+algo.lerning_rate=0.1'"),
    (["~algo"], "invalid override '~algo': rlspeed's keys and config groups cannot be removed"),
    (["hydra.run.dir="], "invalid hydra.run.dir=: expected a folder rlspeed can create"),
    (["--config-name", "nope"], "invalid --config-name=nope: expected a config in the config"),
    (["--config-dir", "/nonexistent"], "invalid --config-dir=/nonexistent: expected an existing"),
]

BAD_URIS = [
    ("sqlite:///", "expected a database file: sqlite:///RELATIVE.db"),
    ("sqlite:////proc/rlspeed/mlflow.db", "expected a database file in a folder rlspeed can"),
    ("file:///tmp/mlruns", "MLflow 3 refuses file stores"),
    ("ftp://host/mlruns", "expected a tracking URI MLflow can record to"),
    ("mysql://user@localhost/mlflow", "expected a database whose Python driver is installed"),
    # Nothing listens on port 1.
    ("postgresql://user@127.0.0.1:1/mlflow", "expected a database server that answers"),
]


def _run_bad(tmp_path, args):
    conf = tmp_path / "conf" / "hparams"
    conf.mkdir(parents=True)
    (conf / "gamma_beyond_one.yaml").write_text(OWN_SEARCH)
    work = tmp_path / "work"
    work.mkdir()
    result = run_cli(["--config-dir", str(tmp_path / "conf"), *args], cwd=work)
    return result, work


@pytest.mark.parametrize(("args", "line"), BAD, ids=[" ".join(args) for args, _ in BAD])
def test_bad_input_is_one_line_exit_2_nothing_created(tmp_path, args, line):
    result, work = _run_bad(tmp_path, [*args, "tracking=none"])
    assert_one_line_error(result, line)
    assert list(work.iterdir()) == [], "bad input must create nothing"


@pytest.mark.parametrize(("uri", "fragment"), BAD_URIS, ids=[uri for uri, _ in BAD_URIS])
def test_tracking_uri_that_cannot_record_is_one_line(tmp_path, uri, fragment):
    result, work = _run_bad(tmp_path, [f"tracking.uri={uri}"])
    assert_one_line_error(result, f"invalid tracking.uri={uri}: ", fragment)
    assert list(work.iterdir()) == [], "no MLflow store, no outputs"


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
    ],
)
def test_inputs_on_the_edge_are_accepted(make_cfg, overrides):
    validate(make_cfg([*overrides, "tracking=none"]))


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
        validate(make_cfg([*overrides, "tracking=none"]))
    assert line in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["algo.tau=0"], "invalid algo.tau=0.0: expected a number in (0, 1]"),
        (["algo=qlearn", "algo.alpha=0"], "invalid algo.alpha=0.0: expected a number in (0, 1]"),
        (["backend.threads=-1"], "invalid backend.threads=-1: expected auto, or an integer >= 0"),
        (["backend.threads=many"], "invalid backend.threads=many: expected auto, or an integer"),
        (["trial.number=3"], "invalid trial.number=3: expected null outside an Optuna sweep"),
        (["tracking.experiment="], "invalid tracking.experiment=: expected a non-empty"),
    ],
)
def test_settings_that_would_run_silently_wrong_are_refused(make_cfg, overrides, line):
    with pytest.raises(ConfigError) as error:
        validate(make_cfg(overrides))
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
