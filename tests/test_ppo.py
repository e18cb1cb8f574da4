"""PPO: torch and flax agree update for update, every kind of stack learns CartPole, bad
hyperparameters are one line, a cut run resumes exactly and ``mode=eval`` scores it.

Learning runs use small seeded budgets of seconds; the full target (CartPole: mean return
of the last 20 episodes >= 475 at the defaults) is measured by training runs.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from rlspeed.core.algos.ppo import PPOConfig
from rlspeed.core.algos.ppo.flax import FlaxLearner, functions
from rlspeed.core.algos.ppo.torch import TorchLearner
from rlspeed.errors import ConfigError
from rlspeed.validation import check
from tests.conftest import learner_cfg, run_cli, run_in, saved_agent, slow_but, vouch
from tests.test_resume import _cut_after_first_log
from tests.test_vpg import (
    _copy_flax_to_torch,
    _doors_batch,
    _flax_weights,
    _pendulum_batch,
    _torch_weights,
)

# ---------------------------------------------------------------- torch == flax

METRICS = {
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
}


@pytest.mark.parametrize(
    ("make_batch", "overrides"),
    [
        # Discrete: Doors' one-hot observations, entropy bonus, clipped value loss.
        (_doors_batch, {"ent_coef": 0.01, "clip_vloss": True, "max_grad_norm": 0.5}),
        # Continuous: a diagonal Gaussian on Pendulum, plain value loss, no clipping.
        (_pendulum_batch, {"ent_coef": 0.0, "clip_vloss": False, "max_grad_norm": 0.0}),
        # HalfCheetah's options: orthogonal init, learners that normalise (the batch's
        # observations stand for normalised ones: the update takes them as stored).
        (
            _pendulum_batch,
            {
                "ent_coef": 0.0,
                "orthogonal_init": True,
                "normalize_obs": True,
                "scale_rewards": True,
            },
        ),
    ],
    ids=["discrete", "continuous", "continuous-options"],
)
def test_torch_and_flax_compute_the_same_update(make_batch, overrides):
    """Three batches (annealed step sizes, optimizer states carried), each 2 epochs of
    4 minibatches in the same given order on both backends."""
    algo = OmegaConf.structured(
        PPOConfig(
            hidden_sizes=[32, 32],
            learning_rate=3e-3,
            update_epochs=2,
            num_minibatches=4,
            initial_log_std=-0.5,
            **overrides,
        )
    )
    # A run of 4 batches of 64 transitions: the step size anneals by a quarter per batch.
    cfg = learner_cfg(algo, total_steps=256, num_envs=2)
    rng = np.random.default_rng(0)
    obs_space, action_space, batch = make_batch(rng, 64)
    flax_learner = FlaxLearner(obs_space, action_space, cfg, seed=0)
    torch_learner = TorchLearner(obs_space, action_space, cfg, seed=0)
    _copy_flax_to_torch(flax_learner, torch_learner)
    fns = functions(cfg, obs_space, action_space)
    # Old log-probabilities near the policy's own, so some ratios are clipped and some not.
    log_probs, _ = fns.log_prob_entropy(flax_learner.agent.policy_params, batch.obs, batch.actions)
    noise = rng.normal(0.0, 0.15, len(log_probs)).astype(np.float32)
    batch = batch._replace(log_probs=np.asarray(log_probs) + noise)
    update = jax.jit(fns.update)

    np.testing.assert_allclose(
        flax_learner.values(batch.obs), torch_learner.values(batch.obs), rtol=1e-5, atol=1e-6
    )
    clipfracs = []
    for _ in range(3):
        orders = np.stack([rng.permutation(64) for _ in range(algo.update_epochs)])
        flax_learner.agent, flax_metrics = update(
            flax_learner.agent, batch, jax.random.key(0), jnp.asarray(orders)
        )
        torch_metrics = torch_learner.update(batch, orders)
        assert flax_metrics.keys() == torch_metrics.keys() == METRICS
        for name, value in flax_metrics.items():
            np.testing.assert_allclose(
                float(value), float(torch_metrics[name]), rtol=1e-4, atol=1e-5, err_msg=name
            )
        clipfracs.append(float(flax_metrics["losses/clipfrac"]))
    assert max(clipfracs) > 0, "the clipped branch of the objective went untested"
    for flax_params, torch_module in (
        (flax_learner.agent.policy_params, torch_learner.policy),
        (flax_learner.agent.value_params, torch_learner.value),
    ):
        flax_w, torch_w = _flax_weights(flax_params), _torch_weights(torch_module)
        assert len(flax_w) == len(torch_w)
        for a, b in zip(flax_w, torch_w, strict=True):
            np.testing.assert_allclose(a, b, atol=2e-5)


def test_update_draws_a_fresh_order_per_epoch_from_its_key():
    """Without a given order, the minibatches follow the key: another key, other weights."""
    algo = OmegaConf.structured(PPOConfig(hidden_sizes=[16], update_epochs=2, num_minibatches=4))
    cfg = learner_cfg(algo, total_steps=256, num_envs=2)
    obs_space, action_space, batch = _doors_batch(np.random.default_rng(0), 64)
    fns = functions(cfg, obs_space, action_space)
    agent = fns.init(jax.random.key(0))
    update = jax.jit(fns.update)
    a, _ = update(agent, batch, jax.random.key(1))
    b, _ = update(agent, batch, jax.random.key(1))
    c, _ = update(agent, batch, jax.random.key(2))
    kernels = [np.asarray(x.value_params["params"]["Dense_0"]["kernel"]) for x in (a, b, c)]
    np.testing.assert_array_equal(kernels[0], kernels[1])
    assert not np.allclose(kernels[0], kernels[2])


def _tail_replaced(batch, valid: int, rng: np.random.Generator):
    """``batch`` with every sample from ``valid`` on replaced by other numbers."""
    return jax.tree.map(
        lambda x: np.concatenate([x[:valid], rng.permutation(x)[valid:] * 3 + 1]), batch
    )


@pytest.mark.parametrize("size", [50, 3], ids=["remainder", "fewer-than-minibatches"])
def test_a_short_last_batch_updates_alike_on_every_path(size):
    """A run's last batch, cut short to end at total_steps, can have any size: 50 splits
    into 4 minibatches of 12 (2 sit the pass out), 3 lends one sample to each of 4. Torch
    and the host flax learner split it alike; the fused update keeps the whole batch's
    shape with ``valid=size`` and computes the same update, whatever the samples past
    ``size`` hold, with given or drawn orders."""
    algo = OmegaConf.structured(
        PPOConfig(hidden_sizes=[32], learning_rate=3e-3, update_epochs=2, num_minibatches=4)
    )
    cfg = learner_cfg(algo, total_steps=256, num_envs=2)
    rng = np.random.default_rng(1)
    obs_space, action_space, batch = _doors_batch(rng, 64)
    short = jax.tree.map(lambda x: x[:size], batch)
    flax_learner = FlaxLearner(obs_space, action_space, cfg, seed=0)
    torch_learner = TorchLearner(obs_space, action_space, cfg, seed=0)
    _copy_flax_to_torch(flax_learner, torch_learner)
    update = jax.jit(functions(cfg, obs_space, action_space).update)
    agent, key = flax_learner.agent, jax.random.key(0)

    orders = np.stack([rng.permutation(size) for _ in range(algo.update_epochs)])
    host, host_metrics = update(agent, short, key, jnp.asarray(orders))
    torch_metrics = torch_learner.update(short, orders)
    for name, value in host_metrics.items():
        np.testing.assert_allclose(float(value), float(torch_metrics[name]), rtol=1e-4, atol=1e-5)
    torch_weights = _torch_weights(torch_learner.policy)
    for a, b in zip(_flax_weights(host.policy_params), torch_weights, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)

    # The fused order: the valid samples first, in the host's order, then the rest.
    rest = np.stack([size + rng.permutation(64 - size) for _ in range(algo.update_epochs)])
    whole_orders = jnp.asarray(np.concatenate([orders, rest], axis=1))
    masked, masked_metrics = update(agent, batch, key, whole_orders, valid=size)
    for name, value in host_metrics.items():
        np.testing.assert_allclose(float(masked_metrics[name]), float(value), rtol=1e-5, atol=1e-6)
    host_weights = _flax_weights(host.policy_params)
    for a, b in zip(_flax_weights(masked.policy_params), host_weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)

    other = _tail_replaced(batch, size, rng)
    for orders in (whole_orders, None):
        a, _ = update(agent, batch, key, orders, valid=size)
        b, _ = update(agent, other, key, orders, valid=size)
        pairs = zip(_flax_weights(a.policy_params), _flax_weights(b.policy_params), strict=True)
        assert all(np.array_equal(x, y) for x, y in pairs)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # conf/algo_task/ppo_cartpole.yaml: 8 envs x 32 steps.
        (
            "algo.num_minibatches=3",
            "algo.num_minibatches=3: expected a divisor of the batch, "
            "algo.num_steps * num_envs = 32 * 8 = 256",
        ),
        ("algo.clip_coef=0.0", "algo.clip_coef=0.0: expected a finite number > 0"),
        ("algo.update_epochs=0", "algo.update_epochs=0: expected an integer in \\[1, 1,000\\]"),
        ("algo.vf_coef=-1.0", "algo.vf_coef=-1.0: expected a finite number >= 0"),
    ],
    ids=["num_minibatches", "clip_coef", "update_epochs", "vf_coef"],
)
def test_bad_hyperparameter_is_one_clear_line(make_cfg, override, message):
    cfg = make_cfg(["algo=ppo", "task=cartpole", override])
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        check(cfg)


# ---------------------------------------------------------------- learning

QUICK = ["tracking=none", "progress=none", "algo=ppo", "task=cartpole"]
# conf/algo_task/ppo_cartpole.yaml's settings for 120 batches instead of 400.
SMALL_CARTPOLE = [
    *QUICK,
    "task.eval_episodes=3",
    "total_steps=30720",
    "log_every=10240",
    "eval_every=30720",
]
# Random CartPole returns about 22.
LEARNED_RETURN = 100


# Slow on every stack: the default selection's PPO learning test is its probe's
# (tests/test_probes.py), which costs a quarter of this one.
@pytest.mark.slow
@pytest.mark.parametrize(("backend", "engine"), [("torch", "gym-sync"), ("flax", "gym-async")])
def test_host_driven_stack_learns_cartpole(backend, engine, make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg([f"backend={backend}", f"env={engine}", *SMALL_CARTPOLE])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    # 120 batches of 8 envs x 32 steps, each 20 epochs of one minibatch.
    assert metrics["env_steps"] == 30720 and metrics["gradient_updates"] == 120 * 20
    assert metrics["recent_return"] > LEARNED_RETURN, metrics
    assert metrics["score"] > LEARNED_RETURN, metrics


@pytest.mark.slow
def test_fused_stack_learns_cartpole_with_three_seeds(make_cfg, tmp_path, monkeypatch):
    """num_seeds=3 on flax + jax-vmap: one vmapped program, three per-seed results."""
    cfg = make_cfg([*SMALL_CARTPOLE, "backend=flax", "env=jax-vmap", "num_seeds=3"])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    assert metrics["num_seeds"] == 3 and len(metrics["seeds"]) == 3
    assert metrics["env_steps"] == 3 * 30720 and metrics["gradient_updates"] == 3 * 120 * 20
    for seed in metrics["seeds"]:
        assert seed["recent_return"] > LEARNED_RETURN, seed
        assert seed["score"] > LEARNED_RETURN, seed


@pytest.mark.parametrize(
    ("backend", "engine", "seeds"),
    # The fused case compiles for 10 s: slow (the short last batch's update is checked on
    # every path by test_a_short_last_batch_updates_alike_on_every_path).
    slow_but(("torch", "gym-sync", 1), [("flax", "jax-vmap", 2), ("torch", "gym-sync", 1)]),
)
def test_a_run_ends_at_total_steps_between_whole_batches(
    backend, engine, seeds, make_cfg, tmp_path, monkeypatch
):
    """Batches of 8 envs x 32 steps: 1000 steps are 3 whole batches and a last one of 29
    steps per env, each batch 20 gradient steps, logged every batch."""
    cfg = make_cfg(
        [
            *QUICK,
            f"backend={backend}",
            f"env={engine}",
            f"num_seeds={seeds}",
            "task.eval_episodes=1",
            "total_steps=1000",
            "log_every=256",
            "eval_every=1000",
        ]
    )
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    assert metrics["env_steps"] == seeds * 1000
    assert metrics["gradient_updates"] == seeds * 4 * 20
    assert np.isfinite(metrics["score"])


# ---------------------------------------------------------------- resume, mode=eval


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "engine"), [("torch", "gym-sync"), ("flax", "jax-vmap")])
def test_resumed_run_ends_like_the_whole_one_and_eval_scores_it(backend, engine, tmp_path):
    """A run cut by SIGTERM and resumed ends with the uninterrupted run's numbers and weights
    (the annealed step size and minibatch orders included); ``mode=eval checkpoint=<run
    folder>`` then scores the saved agent as training's final evaluation did."""
    args = [
        *QUICK[1:],
        "progress=plain",
        f"backend={backend}",
        f"env={engine}",
        "task.eval_episodes=3",
        "total_steps=10240",
        "log_every=2560",
        "eval_every=5120",
        "algo.hidden_sizes=[16]",
    ]
    whole = run_cli([*args, "hydra.run.dir=whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    _cut_after_first_log([*args, "hydra.run.dir=cut"], tmp_path)
    cut = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert cut["status"] == "KILLED" and 0 < cut["env_steps"] < 10240
    resumed = run_cli([*args, "resume=cut", "hydra.run.dir=resumed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "resumed"))
    same = ("score", "recent_return", "env_steps", "gradient_updates")
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    assert saved_agent(tmp_path / "whole") == saved_agent(tmp_path / "resumed")

    # As a run folder written before backend.device existed: its config lacks the key.
    config = tmp_path / "resumed" / "config.yaml"
    config.write_text(config.read_text().replace("  device: auto\n", ""))
    vouch(tmp_path / "resumed")
    evaluated = run_cli(["mode=eval", "checkpoint=resumed", "hydra.run.dir=eval"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert f"rlspeed: score {a['score']:.4f}" in evaluated.stdout


@pytest.mark.slow
def test_shipped_pendulum_settings_learn_pendulum(make_cfg, tmp_path, monkeypatch):
    """`rlspeed algo=ppo task=pendulum` as shipped (conf/algo_task/ppo_pendulum.yaml, 300k
    steps, ~10 s fused): seeds 1-3 scored -134 to -172, where a random policy scores about
    -1200 and PPO's general defaults (128 envs x 128 steps) stayed there."""
    cfg = make_cfg(["algo=ppo", "task=pendulum", "backend=flax", "env=jax-vmap"])
    assert cfg.num_envs == 8 and cfg.algo.normalize_obs and cfg.total_steps == 300_000
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    assert metrics["recent_return"] > -400, metrics
    assert metrics["score"] > -400, metrics
