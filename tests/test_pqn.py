"""PQN: torch and flax agree at init and update for update, the Q(lambda) returns are the
closed form, every kind of stack learns CartPole, a Box-action task is one line.

Learning runs use small seeded budgets; the full target (CartPole: mean return of the last
score >= 475 at conf/algo_task/pqn_cartpole.yaml) is in the slow selection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from gymnasium import spaces
from omegaconf import OmegaConf

from rlspeed.core.algos.pqn import PQNConfig
from rlspeed.core.algos.pqn.flax import FlaxLearner, functions
from rlspeed.core.algos.pqn.torch import TorchLearner
from rlspeed.core.algos.rollout import RolloutBatch, gae
from rlspeed.errors import ConfigError
from rlspeed.validation import check
from tests.conftest import learner_cfg, run_in

METRICS = {"losses/td_loss", "losses/q_values", "charts/epsilon"}
OBS_SPACE = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = spaces.Discrete(3)

# ---------------------------------------------------------------- torch == flax


def _flax_weights(params: dict) -> list[np.ndarray]:
    """Each layer's weights as torch orders them: Dense kernel (transposed) and bias, then
    its LayerNorm's scale and bias."""
    params = params["params"]
    weights = []
    for i in range(sum(name.startswith("Dense_") for name in params)):
        dense = params[f"Dense_{i}"]
        weights += [np.asarray(dense["kernel"]).T, np.asarray(dense["bias"])]
        if (norm := params.get(f"LayerNorm_{i}")) is not None:
            weights += [np.asarray(norm["scale"]), np.asarray(norm["bias"])]
    return weights


def _torch_weights(module: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy() for p in module.parameters()]


def _copy_flax_to_torch(flax_learner: FlaxLearner, torch_learner: TorchLearner) -> None:
    weights = _flax_weights(flax_learner.agent.policy_params.q_params)
    with torch.no_grad():
        for param, weight in zip(torch_learner.q_network.parameters(), weights, strict=True):
            param.copy_(torch.from_numpy(weight.copy()))


def _batch(rng: np.random.Generator, size: int) -> RolloutBatch:
    """Observations, actions and returns of no env; the other fields are not read."""
    zeros = np.zeros(size, np.float32)
    return RolloutBatch(
        rng.normal(size=(size, 4)).astype(np.float32),
        rng.integers(0, ACTION_SPACE.n, size),
        zeros,
        zeros,
        zeros,
        rng.normal(1.0, 2.0, size).astype(np.float32),
    )


def test_the_networks_have_the_same_layers_and_start_alike():
    """LeCun-normal Dense layers with zero biases, each hidden one followed by a LayerNorm
    (scale 1, bias 0), in the same order and shapes on both backends."""
    cfg = learner_cfg(PQNConfig(hidden_sizes=[256, 64]), total_steps=1000)
    flax_agent = FlaxLearner(OBS_SPACE, ACTION_SPACE, cfg, 0).agent
    flax_w = _flax_weights(flax_agent.policy_params.q_params)
    # Runs seed torch's global generator, which draws the weights: seeded here too, or the
    # 1,024 weights' std drifts with the tests a worker ran before (off by 5% in 1 of 10).
    torch.manual_seed(0)
    torch_w = _torch_weights(TorchLearner(OBS_SPACE, ACTION_SPACE, cfg, 0).q_network)
    shapes = [(256, 4), (256,), (256,), (256,), (64, 256), (64,), (64,), (64,), (3, 64), (3,)]
    assert [w.shape for w in flax_w] == [w.shape for w in torch_w] == shapes
    for a, b in zip(flax_w[:5], torch_w[:5], strict=True):  # the large kernels
        if a.ndim == 2:
            assert abs(a.std() / b.std() - 1) < 0.05
    # Dense and LayerNorm biases 0, LayerNorm scales 1.
    for i, value in ((1, 0), (2, 1), (3, 0), (5, 0), (6, 1), (7, 0), (9, 0)):
        assert (flax_w[i] == value).all() and (torch_w[i] == value).all()


def test_torch_and_flax_compute_the_same_update():
    """From the same weights, on the same batches and orders: the same Q-values and returns,
    losses, epsilons and weights after three batches (the step size annealed, the optimizer
    state and the exploration clock carried)."""
    algo = OmegaConf.structured(
        PQNConfig(
            hidden_sizes=[32, 32],
            learning_rate=3e-3,
            update_epochs=2,
            num_minibatches=4,
            max_grad_norm=1.0,
            exploration_fraction=0.5,
        )
    )
    # 4 batches of 64 transitions: the step size anneals by a quarter per batch, epsilon
    # decays over the first two.
    cfg = learner_cfg(algo, total_steps=256, num_envs=2)
    flax_learner = FlaxLearner(OBS_SPACE, ACTION_SPACE, cfg, seed=0)
    torch_learner = TorchLearner(OBS_SPACE, ACTION_SPACE, cfg, seed=0)
    _copy_flax_to_torch(flax_learner, torch_learner)
    update = jax.jit(functions(cfg, OBS_SPACE, ACTION_SPACE).update)
    rng = np.random.default_rng(0)
    batch = _batch(rng, 64)
    np.testing.assert_allclose(
        flax_learner.values(batch.obs), torch_learner.values(batch.obs), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(flax_learner.greedy(batch.obs), torch_learner.greedy(batch.obs))
    epsilons = []
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
        epsilons.append(float(flax_metrics["charts/epsilon"]))
    np.testing.assert_allclose(epsilons, [1.0, 1.0 - 0.95 * 64 / 128, 0.05], rtol=1e-6)
    flax_w = _flax_weights(flax_learner.agent.policy_params.q_params)
    for a, b in zip(flax_w, _torch_weights(torch_learner.q_network), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_the_returns_are_q_lambda_returns():
    """GAE's recursion over V = max_a Q, plus V, is the Q(lambda) return written directly:
    G_t = r_t + gamma ((1 - lambda) max Q(s_t+1) + lambda G_t+1), cut to r_t + gamma max
    Q(final obs) at a truncation and the rollout's end, and to r_t at a termination."""
    rng = np.random.default_rng(0)
    steps, envs, gamma, lam = 6, 3, 0.9, 0.7
    rewards = rng.normal(size=(steps, envs)).astype(np.float32)
    max_q = rng.normal(size=(steps, envs)).astype(np.float32)  # max_a Q(s_t)
    max_q_final = rng.normal(size=(steps, envs)).astype(np.float32)  # of the final obs
    terminated = np.zeros((steps, envs), np.float32)
    truncated = np.zeros((steps, envs), np.float32)
    terminated[2, 0] = truncated[3, 1] = 1.0
    dones = terminated + truncated
    # Where the episode goes on, the final observation is the next one.
    max_q_final[:-1] = np.where(dones[:-1] > 0, max_q_final[:-1], max_q[1:])
    returns = gae(rewards, max_q, max_q_final, terminated, dones, gamma, lam) + max_q
    expected = np.zeros_like(rewards)
    for t in reversed(range(steps)):
        bootstrap = rewards[t] + gamma * (1 - terminated[t]) * max_q_final[t]
        if t == steps - 1:
            expected[t] = bootstrap
        else:
            mixed = rewards[t] + gamma * ((1 - lam) * max_q[t + 1] + lam * expected[t + 1])
            expected[t] = np.where(dones[t] > 0, bootstrap, mixed)
    np.testing.assert_allclose(returns, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # conf/algo_task/pqn_cartpole.yaml: 32 envs x 128 steps.
        (
            ["task=cartpole", "algo.num_minibatches=3"],
            "algo.num_minibatches=3: expected a divisor of the batch, "
            "algo.num_steps * num_envs = 128 * 32 = 4096",
        ),
        (["task=cartpole", "algo.end_e=1.5"], "algo.end_e=1.5: expected a number in [0, 1]"),
        # Discrete actions only: the task's action space named.
        (
            ["task=pendulum"],
            "algo=pqn: expected an algorithm for continuous actions on task=pendulum: ",
        ),
        (
            ["task=gym", "task.id=MountainCarContinuous-v0"],
            "actions, Box(-1.0, 1.0, (1,), float32) (pqn needs Discrete actions): "
            "ppo, sac, td3, vpg",
        ),
    ],
    ids=["num_minibatches", "end_e", "pendulum", "gym-box"],
)
def test_bad_settings_are_one_clear_line(make_cfg, overrides, message):
    cfg = make_cfg(["algo=pqn", "tracking=none", *overrides])
    with pytest.raises(ConfigError) as raised:
        check(cfg)
    assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


# ---------------------------------------------------------------- learning

QUICK = ["tracking=none", "progress=none", "algo=pqn", "task=cartpole"]
# 60 batches of CleanRL's pqn.py shape (4 envs x 128 steps, 4 epochs, a [120, 84] network,
# lambda 0.65, the step size annealed), with a larger step size, exploration over a fifth of
# the run and 8 minibatches a pass: seeds 0-3 on flax + jax-vmap scored 187-308 (random
# CartPole returns about 22).
SMALL_CARTPOLE = [
    *QUICK,
    "task.eval_episodes=3",
    "num_envs=4",
    "total_steps=30720",
    "log_every=10240",
    "eval_every=30720",
    "algo.num_steps=128",
    "algo.update_epochs=4",
    "algo.learning_rate=0.001",
    "algo.anneal_lr=true",
    "algo.gae_lambda=0.65",
    "algo.hidden_sizes=[120,84]",
    "algo.exploration_fraction=0.2",
    "algo.num_minibatches=8",
]
LEARNED_RETURN = 100
STACKS = [("torch", "gym-sync"), ("flax", "gym-sync"), ("flax", "jax-vmap")]


# Slow on every stack: the default selection's PQN learning test is its probe's
# (tests/test_probes.py).
@pytest.mark.slow
@pytest.mark.parametrize(("backend", "engine"), STACKS)
def test_every_stack_learns_cartpole(backend, engine, make_cfg, tmp_path, monkeypatch):
    """Seeds 1-3 on average (one seed on the default selection's stack): at this budget one
    seed's return depends on the CPU's rounding (seed 1 on flax + gym-sync: 88 on an AVX2
    CPU, with seeds 2 and 3 at 326 and 159)."""
    seeds = 1 if (backend, engine) == ("torch", "gym-sync") else 3
    cfg = make_cfg([f"backend={backend}", f"env={engine}", *SMALL_CARTPOLE, f"num_seeds={seeds}"])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    # 60 batches a seed, each 4 epochs of 8 minibatches.
    assert metrics["env_steps"] == seeds * 30720
    assert metrics["gradient_updates"] == seeds * 60 * 4 * 8
    assert metrics["recent_return"] > LEARNED_RETURN, metrics
    assert metrics["score"] > LEARNED_RETURN, metrics


@pytest.mark.slow  # 60-100 s on 2 cores
def test_shipped_cartpole_settings_solve_cartpole(make_cfg, tmp_path, monkeypatch):
    """`rlspeed algo=pqn task=cartpole` as shipped (conf/algo_task/pqn_cartpole.yaml, 500k
    steps, fused) leaves a greedy policy scoring at least 475 in at least 6 of seeds 1-8,
    lanes of one program. PQN can solve CartPole and lose it late in a run, and which seeds
    do follows the CPU's rounding: on a 2-core AVX2 CPU all 24 of seeds 1-24 scored 500
    (rejax's 16 envs: 23). The last 20 episodes, which explore (epsilon 0.05), average at
    least 300 (there: 500 everywhere). The host stacks learn CartPole above, and torch's
    update is flax's (test_torch_and_flax_compute_the_same_update)."""
    cfg = make_cfg([*QUICK, "backend=flax", "env=jax-vmap", "num_seeds=8"])
    metrics = run_in(tmp_path / "run", monkeypatch, cfg)
    lanes = metrics["seeds"]
    scores = [lane["score"] for lane in lanes]
    assert sum(score >= 475 for score in scores) >= len(scores) - len(scores) // 4, scores
    assert np.mean([lane["recent_return"] for lane in lanes]) >= 300, lanes
