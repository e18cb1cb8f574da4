"""task=gymnax: the twin steps as gymnax does, ends episodes as rlspeed's engines must (final
observation kept, termination apart from truncation), runs under jit and vmap over seeds,
trains on every stack, takes a user's registered env, and says what cannot work in one line.

These need the extra (``pip install "rlspeed[gymnax]"``): they carry the ``gymnax`` marker,
which CI runs after installing it. gymnax is imported inside the tests, so the default
selection collects this file without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlspeed.core.tasks.gymnax import GymnaxTaskConfig, make_env, make_functional
from rlspeed.errors import ConfigError
from tests.conftest import assert_one_line_error, cli_env, run_cli, without_rates

pytestmark = pytest.mark.gymnax

TINY = ["tracking=none", "progress=plain"]
# PPO settings that learn CartPole in seconds (conf/algo_task/ppo_cartpole.yaml's).
PPO_CARTPOLE = [
    "algo=ppo", "num_envs=8", "algo.num_steps=32", "algo.gamma=0.98", "algo.gae_lambda=0.8",
    "algo.learning_rate=0.001", "algo.update_epochs=20", "algo.num_minibatches=1",
    "algo.ent_coef=0.0",
]  # fmt: skip

# A user's gymnax env: a corridor of 5 cells walked right to the last, -1 per step, the
# observation (cell / 4, 1) as a Box. The shortest walk returns -4.
USER_ENV = """
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces


@struct.dataclass
class State(environment.EnvState):
    cell: jax.Array


class Corridor(environment.Environment):
    @property
    def default_params(self):
        return environment.EnvParams(max_steps_in_episode=20)

    def step_env(self, key, state, action, params):
        cell = jnp.clip(state.cell + jnp.where(action == 1, 1, -1), 0, 4)
        state = State(time=state.time + 1, cell=cell)
        return self.get_obs(state), state, jnp.float32(-1.0), cell == 4, {}

    def reset_env(self, key, params):
        state = State(time=0, cell=jnp.int32(0))
        return self.get_obs(state), state

    def get_obs(self, state, params=None, key=None):
        return jnp.array([state.cell / 4.0, 1.0], dtype=jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (2,), jnp.float32)
"""
# The user's package registering it with gymnax, for task.import.
USER_MODULE = """
import gymnax
from usertask_corridor import Corridor

gymnax.register("usertask/Corridor-v0", lambda **kwargs: Corridor())
"""
# The user's package offering it as an option of its own (task=corridor), through an
# entry point of the rlspeed.tasks group.
USER_PLUGIN = """
from usertask_corridor import Corridor
from rlspeed.core.tasks.gymnax import gymnax_task

SPEC = gymnax_task("corridor", Corridor())
"""
USER_DISTRIBUTION = {
    "METADATA": "Metadata-Version: 2.1\nName: usertask\nVersion: 0.1\n",
    "entry_points.txt": "[rlspeed.tasks]\ncorridor = usertask_plugin:SPEC\n",
}
CORRIDOR_PPO = ["algo=ppo", "num_envs=8", "total_steps=8192", "log_every=4096"]
# DQN walks the corridor in a few thousand steps: exploration decays over the first 2,000.
CORRIDOR_DQN = [
    "algo=dqn", "num_envs=4", "total_steps=6000", "log_every=3000", "algo.learning_starts=500",
    "algo.exploration_fraction=0.3", "algo.train_frequency=4", "algo.target_network_frequency=200",
]  # fmt: skip


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The user's env and registering module on this process's path and the CLI's."""
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "usertask_corridor.py").write_text(USER_ENV)
    (folder / "usertask_gymnax.py").write_text(USER_MODULE)
    (folder / "usertask_plugin.py").write_text(USER_PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    return {"PYTHONPATH": str(folder)}


@pytest.fixture
def user_distribution(tmp_path: Path, user_package: dict[str, str]) -> dict[str, str]:
    """The user's package installed, as pip leaves a distribution (its metadata folder on
    the path), for the CLI's processes only: this one's plug-ins stay rlspeed's own."""
    folder = tmp_path / "site"
    metadata = folder / "usertask-0.1.dist-info"
    metadata.mkdir(parents=True)
    for name, text in USER_DISTRIBUTION.items():
        (metadata / name).write_text(text)
    return {"PYTHONPATH": f"{user_package['PYTHONPATH']}:{folder}"}


def _cfg(env_id: str, max_steps: int | None = None, **values: object) -> GymnaxTaskConfig:
    from rlspeed.core.tasks.gymnax import settle

    return settle(GymnaxTaskConfig(id=env_id, max_steps=max_steps, **values))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-MinAtar", "Pendulum-v1"])
def test_the_twin_steps_as_gymnax_does(env_id):
    """Key for key, the twin's start and steps are gymnax's ``reset_env``/``step_env``: the
    same observations (as float32), rewards and natural ends."""
    import gymnax

    env, params = gymnax.make(env_id)
    twin = make_functional(_cfg(env_id))
    key = jax.random.key(3)
    obs, state = env.reset_env(key, params)
    ours = twin.initial(key)
    np.testing.assert_array_equal(ours.obs, np.asarray(obs, np.float32))
    for t in range(40):
        step_key = jax.random.fold_in(key, t)
        action = twin.action_space.sample()
        obs, state, reward, terminated, _ = env.step_env(step_key, state, action, params)
        ours = twin.transition(ours, jnp.asarray(action), step_key)
        np.testing.assert_array_equal(twin.observation(ours), np.asarray(obs, np.float32))
        assert float(twin.reward(None, action, ours)) == pytest.approx(float(reward))
        assert bool(twin.terminal(ours)) == bool(terminated)
        if bool(terminated):
            break


def test_traced_env_params_step_as_gymnax_does_at_each_value():
    """Env params as inputs of one program: CartPole's gravity vmapped over three values
    steps each env as gymnax's ``step_env`` does at that value; params its spaces depend on
    (x_threshold bounds the observations) stay constants, and task.params takes the env's
    own names only."""
    import gymnax

    from rlspeed.core.tasks.gymnax import traced, validate

    env, params = gymnax.make("CartPole-v1")
    cfg = _cfg("CartPole-v1", params={"gravity": 9.8, "x_threshold": 3.0})
    assert traced(cfg) == {"params.gravity": 9.8}
    twin = make_functional(cfg)
    assert twin.params.x_threshold == 3.0
    gravities = jnp.array([2.0, 9.8, 30.0])
    key = jax.random.key(5)

    def walk(gravity):
        moved = twin.with_params({"gravity": gravity})
        state = moved.initial(key)
        for t in range(20):
            state = moved.transition(state, jnp.int32(t % 3 == 0), key)
        return state.obs

    traced_obs = jax.jit(jax.vmap(walk))(gravities)
    for row, gravity in zip(traced_obs, gravities, strict=True):
        at = params.replace(gravity=float(gravity), x_threshold=3.0, max_steps_in_episode=500)
        obs, state = env.reset_env(key, at)
        for t in range(20):
            obs, state, *_ = env.step_env(key, state, jnp.int32(t % 3 == 0), at)
        np.testing.assert_allclose(row, np.asarray(obs, np.float32), rtol=1e-5, atol=1e-6)
    assert not np.allclose(traced_obs[0], traced_obs[2])  # gravity made a difference
    with pytest.raises(ConfigError, match=r"task.params.gravty=1.0: expected one of CartPole"):
        validate(_cfg("CartPole-v1", params={"gravty": 1.0}))


def test_a_sweep_over_env_params_is_lanes_of_one_program(tmp_path):
    """A batched sweep over a traced env param trains its trials as one program, and each
    lane learns what a lone run of its trial learns (PPO: to float rounding)."""
    from tests.test_batched_trials import _metrics, _trial_dirs

    run = ["task=gymnax", "task.id=CartPole-v1", *PPO_CARTPOLE, "total_steps=1024"]
    run += ["log_every=256", "tracking=none", "progress=none"]
    sweep = ["hydra/sweeper=optuna", "hydra/sweeper/pruner=none", "hydra.sweeper.n_trials=3"]
    sweep += ["hydra.sweeper.batch_size=3", "hydra.sweeper.sampler.seed=1"]
    result = run_cli(["-m", *run, *sweep, "+task.params.gravity=interval(5.0,15.0)"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "one program of 3 lane(s)" in result.stdout + result.stderr
    trials = _trial_dirs(tmp_path)
    gravities = {t: _config(trials[t])["task"]["params"]["gravity"] for t in trials}
    assert len(set(gravities.values())) == 3
    lone_dir = tmp_path / "alone"
    alone = [*run, f"+task.params.gravity={gravities[1]}", f"hydra.run.dir={lone_dir}"]
    result = run_cli(alone, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lane, lone = _metrics(trials[1]), _metrics(lone_dir)
    for lane_row, lone_row in zip(lane["history"], lone["history"], strict=True):
        expected = without_rates(lone_row)
        assert without_rates(lane_row) == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert lane["score"] == pytest.approx(lone["score"], rel=1e-4, abs=1e-6)


def _config(folder: Path) -> dict:
    import yaml

    return yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())


def _vmap_env(env_id: str, num_envs: int, max_steps: int | None = None):
    from rlspeed.core.envs.vmap import VmapEnv

    cfg = _cfg(env_id, max_steps)
    return VmapEnv(make_functional(cfg), num_envs, cfg.max_steps)


def test_jit_and_vmap_over_seeds_with_rlspeeds_dtypes():
    """Two seeds' envs as lanes of one jitted program: their own streams, float32
    observations and rewards, boolean end flags."""
    env = _vmap_env("Breakout-MinAtar", 4)
    init = jax.jit(jax.vmap(env.init))
    step = jax.jit(jax.vmap(env.step))
    state = init(jax.random.split(jax.random.key(0), 2))
    assert state.obs.shape == (2, 4, 10, 10, 4) and state.obs.dtype == jnp.float32
    actions = jnp.zeros((2, 4), jnp.int32)
    for _ in range(5):
        state, result = step(state, actions)
    assert result.reward.dtype == jnp.float32
    assert result.terminated.dtype == jnp.bool_ and result.truncated.dtype == jnp.bool_
    assert not np.array_equal(state.obs[0], state.obs[1])  # each seed its own envs


def test_an_ended_episode_keeps_its_final_observation_and_says_why():
    """At task.max_steps an episode is truncated (not terminated) and its final observation
    is the step's, not the next episode's start; at a natural end it is terminated."""
    env = _vmap_env("CartPole-v1", 1, max_steps=5)
    state = env.init(jax.random.key(1))
    for t in range(5):
        before = state
        state, result = env.step(state, jnp.array([t % 2], jnp.int32))
    assert bool(result.truncated[0]) and not bool(result.terminated[0])
    assert not np.allclose(result.final_obs, result.obs)  # the next episode has begun
    assert int(result.episode_length[0]) == 5
    # Pushed one way, the pole falls: a termination, whose final observation is past the edge.
    env = _vmap_env("CartPole-v1", 1)
    state = env.init(jax.random.key(2))
    for _ in range(100):
        before = state
        state, result = env.step(before, jnp.array([1], jnp.int32))
        if bool(result.terminated[0]):
            break
    assert bool(result.terminated[0]) and not bool(result.truncated[0])
    assert abs(float(result.final_obs[0, 2])) > 0.2  # beyond 12 degrees: the end it had
    assert abs(float(result.obs[0, 2])) <= 0.05  # a fresh start


def test_the_gymnasium_face_resumes_exactly():
    """The face hands its key and state over (rlspeed_get_state): put back into a fresh env,
    the same actions give the same episode as the original's."""
    from rlspeed.core.engines.env_state import unsaved_state

    cfg = _cfg("Breakout-MinAtar", 50)
    env, copy = make_env(cfg), make_env(cfg)
    assert unsaved_state(env) is None
    env.reset(seed=7)
    for _ in range(3):
        env.step(1)
    copy.reset(seed=0)
    copy.unwrapped.rlspeed_set_state(env.unwrapped.rlspeed_get_state())
    for _ in range(20):
        a, b = env.step(2), copy.step(2)
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:4] == b[1:4]


@pytest.mark.parametrize(
    ("backend", "engine"),
    [("flax", "jax-vmap"), ("torch", "jax-vmap"), ("flax", "gym-sync"), ("torch", "gym-async")],
)
def test_every_stack_trains_on_the_same_env(tmp_path, backend, engine):
    run_dir = tmp_path / "run"
    args = ["task=gymnax", "task.id=CartPole-v1", *PPO_CARTPOLE, f"backend={backend}"]
    budget = ["total_steps=2048", "log_every=1024", "eval_every=2048", f"env={engine}"]
    result = run_cli([*args, *budget, *TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["env_steps"] >= 2048
    assert 8 <= metrics["score"] <= 500  # CartPole-v1's bounds, whatever the agent


def test_ppo_learns_cartpole_fused(tmp_path):
    """gymnax's CartPole in the fused program: PPO's CartPole settings, 3 seeds, 102k steps
    each (about 15 s)."""
    run_dir = tmp_path / "run"
    args = ["task=gymnax", "task.id=CartPole-v1", *PPO_CARTPOLE, "num_seeds=3"]
    budget = ["total_steps=102400", "log_every=10240", "eval_every=51200"]
    result = run_cli([*args, *budget, *TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # A random policy scores about 22; each seed's greedy agent holds the pole far longer.
    scores = [seed["score"] for seed in metrics["seeds"]]
    assert min(scores) >= 250, scores


def test_dqn_runs_a_minatar_game_fused(tmp_path):
    """MinAtar's 10x10x4 grids reach DQN's network (through its conv torso)."""
    run_dir = tmp_path / "run"
    args = ["task=gymnax", "task.id=Breakout-MinAtar", "algo=dqn", "num_envs=8"]
    budget = ["total_steps=2000", "algo.learning_starts=500", "log_every=1000"]
    result = run_cli([*args, *budget, *TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["gradient_updates"] > 0


@pytest.mark.parametrize("algo", [CORRIDOR_PPO, CORRIDOR_DQN], ids=["ppo", "dqn"])
def test_a_users_registered_env_trains_fused(tmp_path, user_package, algo):
    """task.import registers the user's gymnax env; PPO and DQN walk its corridor."""
    run_dir = tmp_path / "run"
    args = ["task=gymnax", "task.import=usertask_gymnax", "task.id=usertask/Corridor-v0"]
    budget = [*algo, f"hydra.run.dir={run_dir}"]
    result = run_cli([*args, *budget, *TINY], cwd=tmp_path, env=user_package)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["score"] == -4.0  # the shortest walk


def test_a_users_env_named_by_an_entry_point_is_an_option(tmp_path, user_distribution):
    """An installed package's entry point names gymnax_task's spec: task=corridor, with no
    task.import, on the fused path and on gym-async (whose workers load it too)."""
    for engine in ("jax-vmap", "gym-async"):
        run_dir = tmp_path / engine
        args = ["task=corridor", *CORRIDOR_PPO, f"env={engine}", f"hydra.run.dir={run_dir}"]
        result = run_cli([*args, *TINY], cwd=tmp_path, env=user_distribution)
        assert result.returncode == 0, result.stderr[-2000:]
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["score"] == -4.0, engine


def test_a_users_env_object_trains_from_python(tmp_path, user_package, monkeypatch):
    """An env object, no registry of the user's: rlspeed.train(task=gymnax_task(...))."""
    from usertask_corridor import Corridor

    import rlspeed
    from rlspeed.core.tasks.gymnax import gymnax_task

    monkeypatch.chdir(tmp_path)
    task = gymnax_task("corridor", Corridor())
    overrides = {key: value for key, value in (arg.split("=") for arg in CORRIDOR_PPO)}
    result = rlspeed.train(task=task, tracking="none", out_dir=tmp_path / "run", **overrides)
    assert result.score == -4.0
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["status"] == "FINISHED" and saved["env_steps"] >= 8192


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["task.id=Nope-v0"], ["task.id=Nope-v0", "a registered gymnax id", "CartPole-v1"]),
        (["task.id=CartPole-v1", "algo=td3"], ["algo=td3", "Discrete(2)", "dqn", "ppo"]),
        (["task.id=Pendulum-v1", "algo=dqn"], ["algo=dqn", "Box(-2.0, 2.0, (1,)", "td3"]),
        (["task.id=CartPole-v1", "task.max_steps=0"], ["task.max_steps=0", "own limit: 500"]),
        (["task.id=CartPole-v1", "+task.kwargs.nope=1"], ["task.kwargs=", "CartPole-v1 takes"]),
    ],
)
def test_what_cannot_work_is_one_line(tmp_path, args, fragments):
    result = run_cli(["task=gymnax", *args, *TINY], cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "outputs").exists()


def test_a_name_given_again_takes_the_new_object_and_a_gymnax_id_is_refused(user_package):
    from usertask_corridor import Corridor

    from rlspeed.core.tasks.gymnax import env_facts, gymnax_task

    with pytest.raises(ConfigError, match="invalid task=CartPole-v1: expected a name that is"):
        gymnax_task("CartPole-v1", Corridor())

    class Wider(Corridor):
        def observation_space(self, params):
            from gymnax.environments import spaces

            return spaces.Box(0.0, 1.0, (3,), jnp.float32)

    first = gymnax_task("again", Corridor())
    assert env_facts(first.schema()).observation_space.shape == (2,)
    second = gymnax_task("again", Wider())
    assert env_facts(second.schema()).observation_space.shape == (3,)


def test_seaborn_waits_for_a_renderer_that_uses_it():
    """gymnax's Pong and MinAtar renderers import seaborn, and seaborn scipy's statistics:
    1.3 s of every process that imports gymnax, for frames rlspeed does not draw. A run's
    process imports them on first use only, and gymnax's renderer still gets seaborn."""
    code = (
        "import sys\n"
        "from rlspeed.core.tasks.gymnax import env_facts\n"
        "from tests.test_gymnax import _cfg\n"
        "env_facts(_cfg('Pong-misc'))\n"
        "print('scipy.stats' in sys.modules)\n"
        "from gymnax.environments.misc import pong\n"
        "palette = pong.sns.color_palette('cubehelix', 3)\n"
        "print(len(palette), type(sys.modules['seaborn']).__name__, 'scipy.stats' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=300
    )
    assert result.stdout.split() == ["False", "3", "module", "True"], result.stderr[-2000:]
