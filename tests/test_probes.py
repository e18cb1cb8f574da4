"""Probe MDPs with closed-form answers (rlspeed/core/envs/probe.py), checked against what every
algorithm learns on each backend and each way an engine feeds it: its value, Q-values or
greedy actions, read back from the run's saved agent, must be the exact ones within
TOLERANCE. Comparing backends with each other passes a mistake they share; these catch it (a
missing discount, bootstrapping through a termination, not bootstrapping at a truncation, a
wrong sign).

The default selection trains one probe per algorithm on torch + gym-sync (the cheapest
path); every other (probe, path) pair is slow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import DictConfig

from rlspeed.core.envs.probe import KINDS, ProbeEnv, observe, target_action
from rlspeed.core.tasks import probe
from rlspeed.errors import ConfigError
from rlspeed.registry import ALGOS, TASKS
from tests.conftest import run_in

GAMMA = 0.5
# The truncation probe's episode length: half its transitions are cut by the time limit
# (more steps would bring the wrong answer below, 1/(1 - gamma (1 - 1/T)), closer).
TRUNCATION_STEPS = 2
# The alternation probe's: odd, so that an episode is cut in state 1 and the next starts in
# state 0 (a target reading the wrong observation at a truncation then learns 1.2, not 2/3).
ALTERNATION_STEPS = 3
EPISODE_STEPS = {"truncation": TRUNCATION_STEPS, "alternation": ALTERNATION_STEPS}
# How far a learned value may be from its closed form. The wrong targets' answers are at
# least 0.5 away at GAMMA 0.5 (0.67 for a truncation treated as a termination).
TOLERANCE = 0.15
# How far a greedy continuous action may be from the optimum (t_s = -0.5 or +0.5).
ACTION_TOLERANCE = 0.15

# Each algorithm's hyperparameters for a probe: small networks, updates from the start,
# fast target networks. The runs are short, so they must converge quickly.
SETTINGS: dict[str, list[str]] = {
    "dqn": [
        "total_steps=2000",
        "num_envs=4",
        "algo.learning_starts=100",
        "algo.buffer_size=1000",
        "algo.batch_size=32",
        "algo.hidden_sizes=[16]",
        "algo.train_frequency=1",
        "algo.target_network_frequency=50",
        "algo.learning_rate=3e-3",
        # Random actions throughout: every action's Q is learned.
        "algo.start_e=1.0",
        "algo.end_e=0.5",
    ],
    "td3": [
        "total_steps=1200",
        "num_envs=4",
        "algo.learning_starts=100",
        "algo.buffer_size=1000",
        "algo.batch_size=32",
        "algo.hidden_sizes=[16]",
        "algo.learning_rate=3e-3",
        "algo.tau=0.05",
    ],
    "sac": [
        "total_steps=1200",
        "num_envs=4",
        "algo.learning_starts=100",
        "algo.buffer_size=1000",
        "algo.batch_size=32",
        "algo.hidden_sizes=[16]",
        "algo.q_lr=3e-3",
        "algo.policy_lr=3e-3",
        "algo.tau=0.05",
        # A small fixed entropy bonus: the soft values it adds stay within a few hundredths
        # of the closed forms.
        "algo.autotune=false",
        "algo.alpha=0.01",
    ],
    "vpg": [
        "total_steps=4096",
        "num_envs=4",
        "algo.num_steps=16",
        "algo.hidden_sizes=[16]",
        "algo.policy_lr=1e-2",
        "algo.value_lr=1e-2",
        # A narrow Gaussian (std 0.37) for the continuous action probe: at std 1, actions
        # clipped to [-1, 1] make a mean beyond the bound the best (E[r] peaks there), so
        # the greedy action would not be the optimum t_s until the std had shrunk.
        "algo.initial_log_std=-1.0",
    ],
    "ppo": [
        "total_steps=4096",
        "num_envs=4",
        "algo.num_steps=16",
        "algo.num_minibatches=2",
        "algo.hidden_sizes=[16]",
        "algo.learning_rate=1e-2",
        "algo.initial_log_std=-1.0",
    ],
    "pqn": [
        "total_steps=4096",
        "num_envs=4",
        "algo.num_steps=16",
        "algo.num_minibatches=2",
        "algo.hidden_sizes=[16]",
        "algo.learning_rate=1e-2",
        # Annealed to 0 over so short a run, the truncation probe's Q stopped at 1.6-1.8 of 2.
        "algo.anneal_lr=false",
        # Random actions throughout: every action's Q is learned.
        "algo.start_e=1.0",
        "algo.end_e=0.5",
    ],
    "qlearn": [
        "total_steps=400",
        "num_envs=4",
        "algo.alpha=0.5",
        "algo.start_e=1.0",
        "algo.end_e=0.5",
    ],
}
# The (actions, observations) each algorithm is probed with: the spaces it works with.
SPACES = {
    "dqn": [("discrete", "continuous")],
    "td3": [("continuous", "continuous")],
    "sac": [("continuous", "continuous")],
    "vpg": [("discrete", "continuous"), ("continuous", "continuous")],
    "ppo": [("discrete", "continuous"), ("continuous", "continuous")],
    "pqn": [("discrete", "continuous")],
    "qlearn": [("discrete", "categorical")],
}
# The algorithms with twin critics of (observation, action), read at the greedy actions.
TWIN_CRITICS = ("td3", "sac")
# Every kind on one path per backend, each its own code: the torch learner fed by Python's
# vector envs, and the flax functions fused into one program with the JAX twin.
PATHS = [("torch", "gym-sync"), ("flax", "jax-vmap")]
# The other engines share those learners' targets; what they change is how final
# observations and the end flags reach them (torch from the JAX twin by DLPack, the flax host
# learner from Python's envs). So they run the probes that end episodes in both ways, in each
# algorithm's first spaces (the action head does not touch the end flags). gym-async hands
# the learner what gym-sync hands it, bit for bit (tests/test_matrix.py, test_engines.py).
CROSS_PATHS = [("torch", "jax-vmap"), ("flax", "gym-sync")]
ENDING_KINDS = ("discount", "truncation", "alternation")
# The constant probe asks nothing of a path that the observation probe (a value per state,
# of either sign) does not: it runs on the default selection's path only.
ONE_PATH_KINDS = ("constant",)
# Categorical observations one-hot into a network (the same code on every engine): on
# ``PATHS``, one per backend, in the probes whose answers differ between states (the
# first state random, or a final observation read apart from the next episode's first).
ONE_HOT = [
    ("dqn", "discrete", "categorical"),
    ("ppo", "discrete", "categorical"),
    ("pqn", "discrete", "categorical"),
]
ONE_HOT_KINDS = ("observation", "action", "alternation")
# The probe each algorithm trains in the default selection, on torch + gym-sync: on a
# 2-core CPU a run there takes 0.3-2 s, where the fused program (flax + jax-vmap) spends
# 5-10 s compiling for each probe.
FAST_PATH = ("torch", "gym-sync")
FAST = {
    "dqn": "alternation",
    "td3": "discount",
    "sac": "discount",
    "vpg": "discount",
    "ppo": "discount",
    "pqn": "alternation",
    "qlearn": "truncation",
}


def cases() -> list[Any]:
    """(algo, kind, actions, observations, backend, env) of every probe run: every kind
    on ``PATHS`` for each algorithm's spaces (``SPACES``; ``ONE_PATH_KINDS`` on
    ``FAST_PATH`` alone), the episode-ending kinds on ``CROSS_PATHS`` too in the first
    spaces, the one-hot ones' ``ONE_HOT_KINDS`` on ``PATHS``."""
    runs = []
    for algo, pairs in SPACES.items():
        for index, (actions, observations) in enumerate(pairs):
            for kind in KINDS:
                paths = [FAST_PATH] if kind in ONE_PATH_KINDS else list(PATHS)
                paths += CROSS_PATHS if kind in ENDING_KINDS and index == 0 else []
                runs += [(algo, kind, actions, observations, *path) for path in paths]
    for algo, actions, observations in ONE_HOT:
        runs += [(algo, k, actions, observations, *p) for k in ONE_HOT_KINDS for p in PATHS]
    return [
        run
        if run[4:] == FAST_PATH and FAST[run[0]] == run[1] and run[2:4] == SPACES[run[0]][0]
        else pytest.param(*run, marks=pytest.mark.slow)
        for run in runs
    ]


# ---------------------------------------------------------------- what an agent learned

# The algorithms whose agents hold Q-values of every action.
Q_ALGOS = ("dqn", "pqn", "qlearn")


class Learned:
    """A run's saved agent as numbers: its values, Q-values and greedy actions of
    observations, through its algorithm's own networks (the checkpoint read as its
    ``load_policies`` reads it)."""

    def __init__(self, folder: Path, cfg: DictConfig) -> None:
        self.cfg, self.algo = cfg, cfg.algo.name
        env = TASKS.get("probe").make_env(cfg.task)
        self.obs_space, self.action_space = env.observation_space, env.action_space
        env.close()
        name = "checkpoint.pt" if cfg.backend.name == "torch" else "checkpoint.msgpack"
        self.path = folder / name
        self.greedy = self._greedy(folder)
        self.q = self._torch() if cfg.backend.name == "torch" else self._flax()

    def _greedy(self, folder: Path) -> Any:
        import rlspeed

        return rlspeed.load(folder).act_batch

    def _torch(self) -> Any:
        """(obs, actions or None) -> Q [B, actions] (dqn, pqn, qlearn), Q1 and Q2 [2, B] of
        the actions (td3, sac) or V [B] (vpg, ppo)."""
        import torch

        from rlspeed.checkpoint import read_agent

        saved = read_agent(self.path, "torch")
        if self.algo == "qlearn":
            return lambda obs, _: saved["q_table"].numpy()[obs.astype(int)]
        learner_class = ALGOS.get(self.algo).backend_module("torch").TorchLearner
        cfg = self.cfg
        learner = learner_class(self.obs_space, self.action_space, cfg, cfg.seed)
        twin = ["qf1", "qf2"]
        names = {"dqn": ["q_network"], "pqn": ["q_network"], "td3": twin, "sac": twin}
        names = names.get(self.algo, ["value"])
        for name in names:
            getattr(learner, name).load_state_dict(saved[name])

        @torch.no_grad()
        def q(obs: np.ndarray, actions: np.ndarray | None) -> np.ndarray:
            x = torch.from_numpy(obs)
            if self.algo in Q_ALGOS:
                return learner.q_network(x).numpy()
            if self.algo in TWIN_CRITICS:
                a = torch.from_numpy(actions)
                return np.stack([learner.qf1(x, a).numpy(), learner.qf2(x, a).numpy()])
            return learner.values(obs)

        return q

    def _flax(self) -> Any:
        import jax
        import jax.numpy as jnp

        from rlspeed.checkpoint import read_agent
        from rlspeed.core.algos.networks.flax import apply_output
        from rlspeed.core.state import agents_from_saved

        module = ALGOS.get(self.algo).backend_module("flax")
        saved = read_agent(self.path, "flax")
        obs_space, action_space, cfg = self.obs_space, self.action_space, self.cfg
        if self.algo == "qlearn":
            table = agents_from_saved({"q_table": jnp.zeros((2, 2))}, saved)["q_table"]
            return lambda obs, _: np.asarray(table)[obs.astype(int)]
        if self.algo == "dqn":
            fns = module.DQNFunctions(obs_space, action_space, cfg)
        elif self.algo == "td3":
            fns = module.TD3Functions(obs_space, action_space, cfg.algo)
        elif self.algo == "sac":
            fns = module.SACFunctions(obs_space, action_space, cfg.algo)
        elif self.algo == "vpg":
            fns = module.VPGFunctions(obs_space, action_space, cfg.algo)
        else:
            fns = module.functions(cfg, obs_space, action_space)
        agent = agents_from_saved(fns.init(jax.random.key(0))._asdict(), saved)

        def q(obs: np.ndarray, actions: np.ndarray | None) -> np.ndarray:
            if self.algo == "dqn":
                return np.asarray(apply_output(fns.network, agent["params"], obs))
            if self.algo == "pqn":
                q_params = agent["policy_params"].q_params
                return np.asarray(apply_output(fns.network, q_params, obs))
            if self.algo in TWIN_CRITICS:
                return np.asarray(fns.critics(agent["critic_params"], obs, actions))
            return np.asarray(fns.values(agent["value_params"], obs))

        return q


def observations(kind: str, observations_kind: str) -> np.ndarray:
    """The observation of state 0 and of state 1, stacked."""
    return np.stack([observe(kind, observations_kind, s, np) for s in (0, 1)])


def expected_values(kind: str) -> list[float | None]:
    """The closed-form value of state 0 and of state 1 (None: a state the probe never
    visits, or whose value depends on the policy: the action probe's)."""
    return {
        "constant": [1.0, None],
        "observation": [-1.0, 1.0],
        "discount": [GAMMA, 1.0],
        "action": [None, None],
        "truncation": [1.0 / (1.0 - GAMMA), None],
        "alternation": [1.0 / (1.0 + GAMMA), -1.0 / (1.0 + GAMMA)],
    }[kind]


def check(learned: Learned, kind: str, actions: str, observations_kind: str) -> None:
    """The learned numbers against the closed forms; one assertion message shows them all."""
    obs = observations(kind, observations_kind)
    greedy = learned.greedy(obs)
    algo = learned.algo
    # TD3, SAC: their critics at the actor's (greedy) actions.
    values = learned.q(obs, greedy.astype(np.float32) if algo in TWIN_CRITICS else None)
    shown = f"values {np.round(values, 3).tolist()}, greedy actions {greedy.tolist()}"
    if kind == "action":
        if actions == "discrete":
            assert greedy.tolist() == [0, 1], shown
        else:
            optimum = target_action(np.array([0.0, 1.0]))
            assert np.abs(greedy[:, 0] - optimum).max() < ACTION_TOLERANCE, shown
        if algo in Q_ALGOS:  # Q(s, s) = 1, Q(s, 1 - s) = 0
            np.testing.assert_allclose(values, np.eye(2), atol=TOLERANCE, err_msg=shown)
        if algo in TWIN_CRITICS:  # Q(s, a) = 1 - (a - t_s)^2, near 1 at the actor's action
            exact = 1.0 - (greedy[:, 0] - optimum) ** 2
            np.testing.assert_allclose(values, np.stack([exact, exact]), atol=TOLERANCE)
        return
    for s, value in enumerate(expected_values(kind)):
        if value is None:
            continue
        # Every action's Q (dqn, pqn, qlearn), both critics' (td3, sac) or V (vpg, ppo): the
        # reward does not depend on the action, so each is the state's value.
        learned_values = values[s] if algo in Q_ALGOS else values[..., s]
        np.testing.assert_allclose(learned_values, value, atol=TOLERANCE, err_msg=shown)


@pytest.mark.parametrize(("algo", "kind", "actions", "observations", "backend", "env"), cases())
def test_learns_the_closed_form(
    algo, kind, actions, observations, backend, env, make_cfg, tmp_path, monkeypatch
):
    steps = EPISODE_STEPS.get(kind, 4)
    overrides = [
        f"algo={algo}",
        "task=probe",
        f"backend={backend}",
        f"env={env}",
        f"task.kind={kind}",
        f"task.actions={actions}",
        f"task.observations={observations}",
        f"task.max_steps={steps}",
        f"algo.gamma={GAMMA}",
        "tracking=none",
        "progress=none",
        *SETTINGS[algo],
    ]
    cfg = make_cfg(overrides)
    folder = tmp_path / "run"
    run_in(folder, monkeypatch, cfg)
    check(Learned(folder, cfg), kind, actions, observations)


# ---------------------------------------------------------------- the probes themselves


def test_the_task_lists_the_env_choices():
    from rlspeed.core.envs import probe as envs

    assert probe.KINDS == envs.KINDS
    assert probe.ACTIONS == envs.ACTION_KINDS
    assert probe.OBSERVATIONS == envs.OBSERVATION_KINDS


def returns(kind: str, actions: str, act: Any, seed: int = 0, max_steps: int = 3) -> list[float]:
    """Per-step rewards of one episode of the Gymnasium env with its time limit."""
    cfg = probe.ProbeTaskConfig(kind=kind, actions=actions, max_steps=max_steps)
    env = probe.make_env(cfg)
    obs, _ = env.reset(seed=seed)
    rewards, done = [], False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(act(obs))
        rewards.append(reward)
        done = terminated or truncated
    env.close()
    return rewards


def test_each_probe_pays_its_closed_form_rewards():
    assert returns("constant", "discrete", lambda o: 0) == [1.0]
    assert returns("discount", "discrete", lambda o: 1) == [0.0, 1.0]
    assert returns("truncation", "discrete", lambda o: 0, max_steps=5) == [1.0] * 5
    assert returns("alternation", "discrete", lambda o: 0, max_steps=3) == [1.0, -1.0, 1.0]
    for seed in range(4):
        first = returns("observation", "discrete", lambda o: 0, seed)
        right = returns("action", "discrete", lambda o: int(o[0] > 0), seed)
        wrong = returns("action", "discrete", lambda o: int(o[0] < 0), seed)
        best = returns("action", "continuous", lambda o: o / 2, seed)
        assert first in ([1.0], [-1.0]) and right == [1.0] and wrong == [0.0], seed
        assert best == [1.0], seed


def test_the_jax_twin_steps_as_the_env_does():
    import jax
    import jax.numpy as jnp

    from rlspeed.core.envs.probe_jax import ProbeFunctional

    for kind in KINDS:
        for actions in ("discrete", "continuous"):
            for observations_kind in ("continuous", "categorical"):
                env = ProbeEnv(kind, actions, observations_kind)
                twin = ProbeFunctional(kind, actions, observations_kind)
                starts = {int(twin.initial(jax.random.key(k))) for k in range(16)}
                assert starts == ({0, 1} if kind in ("observation", "action") else {0})
                for start in sorted(starts):
                    for a in [0, 1] if actions == "discrete" else [[-0.5], [0.25]]:
                        env.reset()
                        env._state = start
                        obs, reward, terminated, _, _ = env.step(np.asarray(a))
                        state = jnp.int32(start)
                        following = twin.transition(state, jnp.asarray(a))
                        case = (kind, actions, observations_kind, start, a)
                        assert float(twin.reward(state, jnp.asarray(a), following)) == reward, case
                        assert bool(twin.terminal(following)) == terminated, case
                        twin_obs = twin.observation(following)
                        np.testing.assert_array_equal(twin_obs, obs)
                        assert env.observation_space.contains(obs), case
                        assert twin_obs.dtype == env.observation_space.dtype, case


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["algo=dqn", "task.kind=discounted"], "task.kind", "one of constant, observation"),
        (["algo=dqn", "task.actions=box"], "task.actions", "one of discrete, continuous"),
        (["algo=dqn", "task.actions=continuous"], "algo", "): ppo, sac, td3, vpg"),
        (["algo=td3"], "algo", "task.actions=discrete (Discrete(2); td3 needs"),
        (["algo=td3", "task.actions=continuous", "task.observations=categorical"], "algo", ""),
        (["algo=qlearn"], "algo", "task.observations=continuous"),
        (
            ["algo=dqn", "task.kind=discount", "task.max_steps=1"],
            "task.max_steps",
            ">= 2 with task.kind=discount",
        ),
    ],
)
def test_a_probe_an_algorithm_cannot_run_is_one_line(make_cfg, overrides, key, fragment):
    from rlspeed.validation import check

    cfg = make_cfg(["task=probe", "tracking=none", *overrides])
    with pytest.raises(ConfigError) as raised:
        check(cfg)
    assert raised.value.key == key and fragment in str(raised.value), str(raised.value)


def test_the_tolerance_tells_wrong_targets_apart():
    """The fixed points of the usual mistakes, at the test's settings, lie outside
    TOLERANCE of the closed forms."""
    wrong = {
        # no discount: V(0) of the discount probe is 1, not gamma
        "discount": (1.0, GAMMA),
        # bootstrapping through the constant probe's termination: 1 / (1 - gamma), not 1
        "constant": (1.0 / (1.0 - GAMMA), 1.0),
        # a truncation taken as a termination: 1 / (1 - gamma (1 - 1/T)), not 1 / (1 - gamma)
        "truncation": (1.0 / (1.0 - GAMMA * (1 - 1 / TRUNCATION_STEPS)), 1.0 / (1.0 - GAMMA)),
        # a reward of the wrong sign
        "observation": (-1.0, 1.0),
        # the next episode's first observation in place of the final one at a truncation
        "alternation": ((1 - GAMMA / 2) / (1 - GAMMA / 2 - GAMMA**2 / 2), 1.0 / (1.0 + GAMMA)),
    }
    for kind, (mistaken, exact) in wrong.items():
        assert abs(mistaken - exact) > 3 * TOLERANCE, kind
