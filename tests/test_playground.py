"""task=playground: the twin steps as MuJoCo Playground's env does, ends episodes as rlspeed's
engines must (final observation kept, termination apart from truncation), runs under jit and
vmap over seeds, learns fused, trains on the other stacks, is filmed without a display, and
says what cannot work in one line.

These need the extra (``pip install "rlspeed[playground]"``): they carry the ``playground``
marker, which CI runs after installing it. Playground is imported inside the tests, so the
default selection collects this file without it."""

from __future__ import annotations

import json
import subprocess

import imageio.v2 as imageio
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlspeed.core.tasks.playground import PlaygroundTaskConfig, make_env, make_functional, settle
from rlspeed.machine import GL_PACKAGES, headless_gl
from rlspeed.seeding import Stream, jax_key
from tests.conftest import RLSPEED, assert_one_line_error, headless_env, run_cli

pytestmark = pytest.mark.playground

TINY = ["tracking=none", "progress=plain"]


def _cfg(env_id: str, max_steps: int | None = None, **values: object) -> PlaygroundTaskConfig:
    return settle(PlaygroundTaskConfig(id=env_id, max_steps=max_steps, **values))


@pytest.mark.parametrize("env_id", ["CartpoleBalance", "ReacherEasy"])
def test_the_twin_steps_as_playground_does(env_id):
    """Key for key and action for action, the twin's start and steps are the env's own
    ``reset`` and ``step``: the same states, observations (float32), rewards and ends."""
    from mujoco_playground import dm_control_suite

    env = dm_control_suite.load(env_id, config_overrides={"impl": "jax"})
    twin = make_functional(_cfg(env_id))

    def episode(start, step, observe, reward, ended, key, actions):
        def one(state, action):
            following = step(state, action)
            return following, (observe(following), reward(following), ended(following))

        return jax.lax.scan(one, start(key), actions)

    def both(key, actions):  # one compiled program for the two
        theirs = episode(
            env.reset, env.step, lambda s: s.obs, lambda s: s.reward, lambda s: s.done > 0,
            key, actions,
        )  # fmt: skip
        ours = episode(
            twin.initial, twin.transition, twin.observation,
            lambda s: twin.reward(None, None, s), twin.terminal, key, actions,
        )  # fmt: skip
        return theirs, ours

    actions = jax.random.uniform(jax.random.key(4), (40, env.action_size), minval=-1, maxval=1)
    (theirs, seen), (ours, ours_seen) = jax.jit(both)(jax.random.key(3), actions)
    for mine, other in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        if jnp.issubdtype(mine.dtype, jax.dtypes.prng_key):
            mine, other = jax.random.key_data(mine), jax.random.key_data(other)
        np.testing.assert_array_equal(mine, other)
    for mine, other in zip(ours_seen, seen, strict=True):
        np.testing.assert_array_equal(mine, other)
    assert ours_seen[0].dtype == jnp.float32 and ours_seen[1].dtype == jnp.float32
    assert not np.allclose(seen[0][0], seen[0][-1])  # the actions moved the model


def _vmap_env(env_id: str, num_envs: int, max_steps: int | None = None):
    from rlspeed.core.envs.vmap import VmapEnv

    cfg = _cfg(env_id, max_steps)
    return VmapEnv(make_functional(cfg), num_envs, cfg.max_steps)


def test_jit_vmap_dtypes_final_observations_and_why_an_episode_ended():
    """Two seeds' envs as lanes of one jitted program, each its own envs; float32
    observations and rewards, boolean end flags. At task.max_steps an episode is truncated
    (not terminated) and its final observation is the step's, not the next start; the env's
    own end (its physics gone NaN) is a termination."""
    env = _vmap_env("CartpoleBalance", 3, max_steps=5)
    init, step = jax.jit(jax.vmap(env.init)), jax.jit(jax.vmap(env.step))
    state = init(jax.random.split(jax.random.key(0), 2))
    assert state.obs.shape == (2, 3, 5) and state.obs.dtype == jnp.float32
    assert not np.array_equal(state.obs[0], state.obs[1])
    push = jnp.ones((2, 3, 1), jnp.float32)
    for _ in range(5):
        state, result = step(state, push)
    assert result.reward.dtype == jnp.float32
    assert result.terminated.dtype == jnp.bool_ and result.truncated.dtype == jnp.bool_
    assert bool(result.truncated.all()) and not bool(result.terminated.any())
    assert (result.episode_length == 5).all()
    # Pushed right for 5 steps the cart moved; the next episode starts near the middle.
    assert not np.allclose(result.final_obs, result.obs)
    np.testing.assert_array_equal(result.obs, state.obs)
    # A NaN control makes the physics NaN: the env's done, a termination before the limit.
    state, result = step(state, jnp.full((2, 3, 1), jnp.nan))
    assert bool(result.terminated.all()) and not bool(result.truncated.any())
    assert np.isnan(result.final_obs).any() and not np.isnan(result.obs).any()


def test_the_gymnasium_face_steps_the_twin_and_resumes_exactly():
    """The face's episode is the twin's, and it hands its key and state over
    (rlspeed_get_state): put back into a fresh env, the same actions give the same steps."""
    from rlspeed.core.engines.env_state import unsaved_state

    cfg = _cfg("CartpoleBalance", 50)
    env, copy = make_env(cfg), make_env(cfg)
    assert unsaved_state(env) is None
    obs, _ = env.reset(seed=7)
    assert obs.dtype == np.float32 and obs.shape == (5,)
    # The twin from the same key (the seed's env stream, split once), with the same actions.
    twin = make_functional(cfg)
    initial, transition = jax.jit(twin.initial), jax.jit(twin.transition)
    state = initial(jax.random.split(jax_key(7, Stream.ENV))[1])
    np.testing.assert_array_equal(obs, twin.observation(state))
    for _ in range(3):
        obs, reward, *_ = env.step(np.array([0.3]))
        state = transition(state, jnp.array([0.3], jnp.float32))
        np.testing.assert_array_equal(obs, twin.observation(state))
        assert reward == float(twin.reward(None, None, state))
    copy.reset(seed=0)
    copy.unwrapped.rlspeed_set_state(env.unwrapped.rlspeed_get_state())
    for _ in range(10):
        a, b = env.step(np.array([-0.5])), copy.step(np.array([-0.5]))
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:4] == b[1:4]


def test_ppo_learns_cartpole_balance_fused(tmp_path):
    """PPO in the fused program on CartpoleBalance, 200k steps (about a minute on two CPU
    cores, half of it compiling): a uniformly random policy returns 363 +- 59 (16 episodes),
    the greedy agent holds the pole up for nearly every one of the 1000 steps."""
    run_dir = tmp_path / "run"
    # PPO's settings for the suite: conf/algo_task/ppo_playground.yaml.
    args = ["task=playground", "task.id=CartpoleBalance", "algo=ppo", "seed=1"]
    budget = ["total_steps=204800", "log_every=20480", "eval_every=204800"]
    result = run_cli([*args, *budget, *TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["score"] >= 800, metrics["score"]


@pytest.mark.parametrize(
    ("algo", "backend", "engine"),
    [("sac", "flax", "jax-vmap"), ("ppo", "torch", "jax-vmap"), ("td3", "torch", "gym-sync")],
)
def test_the_other_algorithms_and_stacks_train(tmp_path, algo, backend, engine):
    """The replay algorithms' fused program (SAC's; TD3's is the same loop, ~70 s of MJX
    compiling each), torch through DLPack on jax-vmap and on the Gymnasium face: a short run
    that finishes and scores within CartpoleBalance's bounds. The on-policy fused program
    learns above (PPO's; VPG's is the same loop)."""
    run_dir = tmp_path / "run"
    args = ["task=playground", "task.id=CartpoleBalance", "task.max_steps=200", f"algo={algo}"]
    args += [f"backend={backend}", f"env={engine}", "num_envs=4", "task.eval_episodes=2"]
    if algo in ("td3", "sac"):
        args += ["algo.learning_starts=400", "algo.batch_size=64"]
    else:
        args += ["algo.num_steps=128"]
    budget = ["total_steps=2048", "log_every=1024", "eval_every=2048"]
    result = run_cli([*args, *budget, *TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["env_steps"] >= 2048
    assert 0 <= metrics["score"] <= 1000  # rewards in [0, 1], scored at 1000 steps


@pytest.mark.skipif(headless_gl() is None, reason=f"neither libEGL nor libOSMesa ({GL_PACKAGES})")
def test_video_every_films_the_env_as_mujoco_draws_it_without_a_display(tmp_path):
    """Playground's envs are filmed through their Gymnasium face, drawn by MuJoCo with the
    OpenGL rlspeed picks (MUJOCO_GL unset), one frame per control step."""
    args = ["task=playground", "task.id=CartpoleBalance", "task.max_steps=50", "algo=ppo"]
    args += ["backend=torch", "env=gym-sync", "num_envs=4", "algo.num_steps=64"]
    args += ["task.eval_episodes=1", "total_steps=256", "log_every=256", "video_every=256"]
    trained = subprocess.run(
        [RLSPEED, *args, *TINY, "hydra.run.dir=run"], cwd=tmp_path, env=headless_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    frames = imageio.mimread(tmp_path / "run" / "videos" / "step_256.gif")
    assert len(frames) == 1 + 50 and frames[0].shape == (240, 320, 3)
    assert frames[-1].std() > 10  # the cart and pole on their floor, not a blank image


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["task.id=Nope"], ["task.id=Nope", "a DM Control suite env", "CartpoleBalance"]),
        (
            ["task.id=Go1JoystickFlatTerrain"],
            ["task.id=Go1JoystickFlatTerrain", "downloaded from MuJoCo Menagerie"],
        ),
        (["task.id=CartpoleBalance", "algo=dqn"], ["algo=dqn", "Box(-1.0, 1.0, (1,)", "td3"]),
        (["task.id=CartpoleBalance", "+task.kwargs.impl=warp"], ["task.kwargs.impl=warp"]),
        (["task.id=CartpoleBalance", "+task.kwargs.nope=1"], ["task.kwargs=", "ctrl_dt"]),
        (
            ["task.id=CartpoleBalance", "task.max_steps=0", "algo=ppo"],
            ["task.max_steps=0", "limit: 1,000"],
        ),
    ],
)
def test_what_cannot_work_is_one_line(tmp_path, args, fragments):
    result = run_cli(["task=playground", *args, *TINY], cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "outputs").exists()
