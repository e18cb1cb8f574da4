"""Every part a host-driven loop carries over ``resume=`` says what its state is
(``state_dict`` / ``load_state_dict``), and ``rlspeed.core.state.capture`` / ``restore`` take
that and nothing else: a part that says nothing is one line, never a state skipped in
silence.

The guard against a state a learner forgets to say: for every algorithm on every
host-driven pairing, a learner, its replay buffer and its engine saved after some
iterations, written to a resume file, read back into parts built anew (the learner with
another seed) continue exactly like the parts that were never stopped. A learner that keeps
something its ``state_dict`` leaves out fails that check (``test_a_state_left_out_...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlspeed import statefile
from rlspeed.checkpoint import RESUME_FILE, save_resume
from rlspeed.core.algos import import_named
from rlspeed.core.algos.qlearn.torch import TorchQTable
from rlspeed.core.algos.replay import ReplayBuffer
from rlspeed.core.state import capture, restore
from rlspeed.core.tasks.gridworld import GridWorldTaskConfig
from rlspeed.errors import RLSpeedError
from rlspeed.registry import ALGOS, BACKENDS, ENGINES, TASKS
from rlspeed.validation import check

SMALL = ["num_envs=2", "total_steps=2000", "tracking=none", "progress=none"]
# Per algorithm: its run (small networks, updates from the first iterations on) and the
# iterations before and after the cut. Continuous actions on VPG (the action bounds), both
# normalisations on PPO, PQN's exploration clock, TD3's OU noise and SAC's OU draws.
RUNS = {
    "dqn": (
        ["algo=dqn", "task=gridworld", "algo.hidden_sizes=[8]", "algo.learning_starts=20"]
        + ["algo.buffer_size=40", "algo.batch_size=8", "algo.target_network_frequency=10"],
        (30, 10),
    ),
    "td3": (
        ["algo=td3", "task=pendulum", "algo.hidden_sizes=[8]", "algo.learning_starts=20"]
        + ["algo.buffer_size=40", "algo.batch_size=8", "algo.exploration=ou"],
        (30, 10),
    ),
    "sac": (
        ["algo=sac", "task=pendulum", "algo.hidden_sizes=[8]", "algo.learning_starts=20"]
        + ["algo.buffer_size=40", "algo.batch_size=8", "algo.exploration=ou"],
        (30, 10),
    ),
    "vpg": (["algo=vpg", "task=pendulum", "algo.hidden_sizes=[8]", "algo.num_steps=8"], (2, 2)),
    "ppo": (
        ["algo=ppo", "task=pendulum", "algo.hidden_sizes=[8]", "algo.num_steps=8"]
        + ["algo.num_minibatches=2", "algo.update_epochs=2"]
        + ["algo.normalize_obs=true", "algo.scale_rewards=true"],
        (2, 2),
    ),
    "pqn": (
        ["algo=pqn", "task=gridworld", "algo.hidden_sizes=[8]", "algo.num_steps=8"]
        + ["algo.num_minibatches=2", "algo.update_epochs=2"],
        (2, 2),
    ),
    "qlearn": (["algo=qlearn", "task=gridworld"], (10, 20)),
}
PAIRINGS = {
    "torch-gym-sync": ["backend=torch", "env=gym-sync"],
    "torch-jax-vmap": ["backend=torch", "env=jax-vmap"],
    "flax-gym-sync": ["backend=flax", "env=gym-sync"],
}


class Episodes:
    """Where an iteration hands its finished episodes: nowhere (the parts' state is what is
    compared)."""

    def episodes(self, *args: Any) -> None:
        pass


def _config(make_cfg, algo: str, pairing: str) -> Any:
    cfg = make_cfg([*RUNS[algo][0], *PAIRINGS[pairing], *SMALL])
    return check(cfg).cfg


def _build(cfg: Any, seed: int, learner_class: Any = None) -> tuple[dict[str, Any], Any]:
    """The parts a host-driven loop carries (learner, what it carries, engine), the learner
    of ``seed`` (the engine of the run's), and the observations of the engine's reset."""
    engine = ENGINES.get(cfg.env.name).make(
        TASKS.get(cfg.task.name), cfg.task, cfg.env, cfg.num_envs, cfg.seed
    )
    if learner_class is None:
        learner_class = import_named(ALGOS.get(cfg.algo.name).learners[cfg.backend.name])
    # As a run sets its backend up: torch's initial weights from the seed, JAX's programs
    # kept in the session's compilation cache (the learner built anew compiles them again).
    BACKENDS.get(cfg.backend.name).setup(cfg.backend, seed)
    learner = learner_class(
        engine.single_observation_space, engine.single_action_space, cfg=cfg, seed=seed
    )
    observe = getattr(learner, "observe", None)
    obs = engine.reset() if observe is None else observe(engine.reset())
    return {"learner": learner, **getattr(learner, "carried", {}), "engine": engine}, obs


def _iterate(parts: dict[str, Any], obs: Any, step: int, n: int) -> tuple[Any, int, list]:
    """``n`` iterations from ``step``: the observations and step they end at, and each
    update's metrics as floats."""
    metrics = []
    for _ in range(n):
        done = parts["learner"].iteration(parts["engine"], obs, step, Episodes())
        obs, step = done.obs, step + done.steps
        metrics += [{k: float(v) for k, v in m.items()} for m in done.metrics]
    return obs, step, metrics


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Two states alike: the same keys, types, dtypes, shapes and values."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs {b.dtype}"
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def resumed_like_uninterrupted(
    cfg: Any, cut: int, after: int, folder: Path, learner_class: Any = None
) -> None:
    """Run ``cut`` iterations, save every part's state in a resume file, go on ``after``
    more; parts built anew (the learner of another seed) with that file's state put back
    then make the same ``after`` iterations: the same metrics and, at the end, the same
    state in every part."""
    whole, obs = _build(cfg, cfg.seed, learner_class)
    obs, step, _ = _iterate(whole, obs, 0, cut)
    parts = {name: capture(part) for name, part in whole.items()}
    state = {"step": step, "obs": np.asarray(obs), "parts": parts, "config": {}}
    save_resume(state, folder / RESUME_FILE)
    _, whole_step, whole_metrics = _iterate(whole, obs, step, after)

    saved = statefile.load(folder / RESUME_FILE)
    resumed, _ = _build(cfg, cfg.seed + 1, learner_class)
    for name, part in resumed.items():
        restore(part, saved["parts"][name])
    _, resumed_step, resumed_metrics = _iterate(resumed, saved["obs"], saved["step"], after)
    assert resumed_step == whole_step
    assert resumed_metrics == whole_metrics
    for name in whole:
        assert_same(capture(whole[name]), capture(resumed[name]), name)


# The jitted flax learners (5-8 s each, most of it compiling) run in the slow selection: the
# default one keeps the torch pairings, whose parts are the same kinds (replay, rollouts,
# normalisation, tables, engines).
@pytest.mark.parametrize(
    "pairing",
    [p if p.startswith("torch") else pytest.param(p, marks=pytest.mark.slow) for p in PAIRINGS],
)
@pytest.mark.parametrize("algo", list(RUNS))
def test_parts_put_back_from_a_resume_file_continue_like_the_uninterrupted_ones(
    algo, pairing, make_cfg, tmp_path
):
    cut, after = RUNS[algo][1]
    resumed_like_uninterrupted(_config(make_cfg, algo, pairing), cut, after, tmp_path)


class ExploresForAWhile(TorchQTable):
    """A Q-table that explores for its first 15 iterations, then acts greedily: it counts
    its iterations in an attribute of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acted = 0

    def act(self, states: np.ndarray, step: int, epsilon: float) -> torch.Tensor:
        self.acted += 1
        return super().act(states, step, epsilon if self.acted <= 15 else 0.0)


class SaysItsCount(ExploresForAWhile):
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "acted": self.acted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.acted = state["acted"]


def test_a_state_left_out_of_state_dict_is_caught_by_the_resume_check(make_cfg, tmp_path):
    """Nothing finds an attribute by reflection any more: a learner that adds one to what
    it keeps and not to its ``state_dict`` resumes with it reset. The check every
    algorithm runs above (resumed = uninterrupted) sees it; said, it passes."""
    cfg = _config(make_cfg, "qlearn", "torch-gym-sync")
    with pytest.raises(AssertionError):
        resumed_like_uninterrupted(cfg, 10, 20, tmp_path, ExploresForAWhile)
    resumed_like_uninterrupted(cfg, 10, 20, tmp_path, SaysItsCount)


def test_a_part_that_does_not_say_its_state_is_one_line():
    """A part without ``state_dict``/``load_state_dict`` is one line naming its class, on
    the way out (capture) as on the way in (restore); its attributes are not looked into."""

    class Counter:
        def __init__(self) -> None:
            self.count = np.zeros(3)

    class SaysButCannotTake(Counter):
        def state_dict(self) -> dict[str, Any]:
            return {"count": self.count}

    calls = (capture, lambda part: restore(part, {"count": np.ones(3)}))
    for part, name in ((Counter(), "Counter"), (SaysButCannotTake(), "SaysButCannotTake")):
        for call in calls:
            with pytest.raises(RLSpeedError) as raised:
                call(part)
            message = str(raised.value)
            assert message.startswith(
                f"rlspeed: {name} has no state_dict()/load_state_dict(), so its state cannot "
                "be saved for resume=; "
            )
            assert "\n" not in message
        np.testing.assert_array_equal(part.count, np.zeros(3))


def test_a_saved_array_of_another_shape_is_refused(make_cfg):
    """A saved replay buffer or Q-table whose arrays have other shapes than the ones the
    run's config builds is a ValueError (the run's one line), not broadcast into them."""
    env = TASKS.get("gridworld").make_env(GridWorldTaskConfig())

    def buffer(capacity: int) -> ReplayBuffer:
        rng = np.random.default_rng(0)
        return ReplayBuffer(capacity, env.observation_space, env.action_space, rng, 2, 10)

    with pytest.raises(ValueError, match=r"the shapes differ: obs has shape \(22,\) in the file"):
        restore(buffer(30), capture(buffer(20)))

    cfg = _config(make_cfg, "qlearn", "torch-gym-sync")
    small = TorchQTable(env.observation_space, env.action_space, cfg, 0)
    state = capture(small) | {"q": torch.zeros(3, 4)}
    with pytest.raises(ValueError, match=r"the shapes differ: q has shape \(3, 4\)"):
        restore(small, state)
