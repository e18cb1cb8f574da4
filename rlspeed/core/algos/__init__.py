"""Algorithms: one subpackage each, with ``SPEC`` in its ``__init__`` and one file per backend."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from rlspeed.config import ROLLING_EPISODES, plain
from rlspeed.core.algos.networks import (
    NETWORKS,
    NetworkChoice,
    TorsoSize,
    fits_torso,
    takes_torso,
    torso_size,
)
from rlspeed.errors import ConfigError
from rlspeed.machine import physical_memory
from rlspeed.registry import ENGINES, TASKS

if TYPE_CHECKING:
    from rlspeed.config import RunConfig

# CleanRL's PPO takes 4-10 epochs per batch, VPG setups tens of value steps.
MAX_PASSES = 1_000
# Range name -> (the test a hyperparameter must pass, what is allowed, as the error says it).
# The tests are False for NaN, and the open ones bound inf out: a rate or a noise scale of
# inf or nan would train on garbage.
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (lambda value: value >= 1, "an integer >= 1"),
    "steps": (lambda value: value >= 0, "an integer >= 0"),
    # Passes over one batch (PPO's epochs, VPG's value steps): each costs a whole batch's
    # work, and their bookkeeping (PPO's permutations, the losses) grows with the count.
    "passes": (lambda value: 1 <= value <= MAX_PASSES, f"an integer in [1, {MAX_PASSES:,}]"),
    "unit": (lambda value: 0.0 <= value <= 1.0, "a number in [0, 1]"),
    # A step size or a Polyak factor: 0 would never move anything.
    "step": (lambda value: 0.0 < value <= 1.0, "a number in (0, 1]"),
    "positive": (lambda value: 0 < value < math.inf, "a finite number > 0"),
    "non_negative": (lambda value: 0 <= value < math.inf, "a finite number >= 0"),
    "off_at_zero": (lambda value: 0 <= value < math.inf, "a finite number >= 0 (0 turns it off)"),
    "finite": (math.isfinite, "a finite number"),
}
# A stored transition's bytes besides its observation (action, reward, done flag),
# rounded up to cover every task's action space (HalfCheetah: 6 float32s).
TRANSITION_EXTRA_BYTES = 64
# Copies of each network weight a learner holds: the weight, its gradient and Adam's two
# moments (target networks and twin critics come on top).
WEIGHT_COPIES = 4
# Bytes of one entry of a network input batch: torch builds a one-hot input as int64
# classes, then float32 (and an image's conv features as float32, then their flattened copy).
INPUT_BYTES = 12
# An MLP's hidden layers: more or wider than these is a runaway list or a typo, not a
# network these algorithms train (a layer that wide is 2**48 weights from the one before).
MAX_HIDDEN_LAYERS = 64
MAX_HIDDEN_WIDTH = 2**24


class NetworkSettings(Protocol):
    """What ``check_hidden_sizes`` reads of an algorithm's config."""

    @property
    def hidden_sizes(self) -> Sequence[int]: ...


def check_ranges(algo: object, **keys_by_range: tuple[str, ...]) -> None:
    """Reject the first ``algo.<key>`` outside its range (a key of ``RANGES``), in the order
    given, with one ConfigError line."""
    for range_name, keys in keys_by_range.items():
        test, allowed = RANGES[range_name]
        for key in keys:
            if not test(value := getattr(algo, key)):
                raise ConfigError(f"algo.{key}", value, allowed)


def _setting(cfg: RunConfig, key: str) -> int:
    """The run's size setting ``key`` (dotted: ``algo.buffer_size``)."""
    value: Any = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return int(value)


def check_hidden_sizes(algo: NetworkSettings) -> None:
    """1 to MAX_HIDDEN_LAYERS widths in [1, MAX_HIDDEN_WIDTH]; the length first, so a runaway
    list costs no more than its count."""
    sizes = algo.hidden_sizes
    # The schema's list[int] lets a nested list ([[1]]) through.
    if not 1 <= len(sizes) <= MAX_HIDDEN_LAYERS or not all(
        type(size) is int and 1 <= size <= MAX_HIDDEN_WIDTH for size in sizes
    ):
        shown = plain(sizes)
        allowed = (
            f"a non-empty list of integers >= 1: at most {MAX_HIDDEN_LAYERS} of them, each at "
            f"most {MAX_HIDDEN_WIDTH:,}"
        )
        raise ConfigError("algo.hidden_sizes", shown, allowed)


def check_network(algo: NetworkChoice, cfg: RunConfig) -> None:
    """``algo.network`` one of NETWORKS, and ``cnn`` only on image observations the conv
    torso fits (``rlspeed.core.algos.networks``)."""
    if algo.network not in NETWORKS:
        raise ConfigError("algo.network", algo.network, f"one of {', '.join(NETWORKS)}")
    image = TASKS.get(cfg.task.name).image_shape(cfg.task)
    if algo.network == "cnn" and (image is None or not fits_torso(image)):
        env_id = getattr(cfg.task, "id", None)  # task=gym's and task=gymnax's
        task = f"task={cfg.task.name}" if env_id is None else f"task.id={env_id}"
        observations = "no images" if image is None else f"images of {image}"
        raise ConfigError(
            "algo.network",
            algo.network,
            f"auto or mlp: cnn takes image observations (a Box of height x width x channels, "
            f"at least 3 x 3), and {task}'s are {observations}",
        )


class NetworkSize(NamedTuple):
    """One network of ``algo.hidden_sizes`` (behind the conv torso where it takes one) at the
    task's settings, the small output layer aside."""

    weights: int
    # Multiply-adds of one row through it (a conv applies each weight at every position).
    multiply_adds: int
    # Entries of one row's input (``TaskSpec.network_inputs``) and of its conv features.
    input_entries: int


def network_size(cfg: RunConfig) -> NetworkSize:
    """The size of the network ``cfg`` trains, from the task's input width
    (``TaskSpec.network_inputs``) and image shape. Algorithms without ``algo.network``
    (TD3, SAC) flatten every observation into their MLP."""
    task = TASKS.get(cfg.task.name)
    inputs = task.network_inputs(cfg.task)
    image = task.image_shape(cfg.task)
    conv = image is not None and takes_torso(getattr(cfg.algo, "network", "mlp"), image)
    # Without a torso the input itself enters the hidden layers.
    torso = torso_size(image) if image is not None and conv else TorsoSize(0, 0, inputs)
    widths = [torso.features, *cfg.algo.hidden_sizes]
    dense = sum(a * b for a, b in zip(widths, widths[1:], strict=False))
    features = torso.features if conv else 0
    return NetworkSize(torso.weights + dense, torso.multiply_adds + dense, inputs + features)


def batch_rows(cfg: RunConfig) -> int:
    """Rows of the largest batch one agent's network sees: an update's batch, or one row per
    env when acting on more envs than that."""
    algo = cfg.algo
    rows: int
    if hasattr(algo, "batch_size"):
        rows = algo.batch_size
    else:  # on-policy: the rollout (num_steps of every env) in num_minibatches parts
        rows = algo.num_steps * cfg.num_envs // getattr(algo, "num_minibatches", 1)
    return max(rows, cfg.num_envs)


def check_network_memory(cfg: RunConfig) -> None:
    """Networks and their inputs that fit in memory: every agent trained at once holds each
    weight WEIGHT_COPIES times (the weight, its gradient, Adam's two moments) and its
    largest input batch (``batch_rows``) at INPUT_BYTES an entry; a wide one-hot input
    costs in both. Last in a check: the input width may load the task's env module."""
    algo, agents = cfg.algo, agents_at_once(cfg)
    size = network_size(cfg)
    weights = size.weights * agents
    entries = batch_rows(cfg) * size.input_entries * agents
    needed, available = 4 * WEIGHT_COPIES * weights + INPUT_BYTES * entries, physical_memory()
    if needed > available:
        inputs = TASKS.get(cfg.task.name).network_inputs(cfg.task)
        raise ConfigError(
            "algo.hidden_sizes",
            list(algo.hidden_sizes),
            f"networks that fit in memory: {inputs:,} inputs make {weights:,} float32 weights, "
            f"{WEIGHT_COPIES} copies each, and batches of {entries:,} input entries; they need "
            f"{needed / 2**30:,.1f} GiB, this machine has {available / 2**30:,.1f} GiB",
        )


def check_memory(cfg: RunConfig, *stores: tuple[str, int], observations: int = 0) -> None:
    """Refuse sizes whose arrays cannot fit in this machine's physical memory, before they
    hang a run (num_envs=10**12 or buffer_size=10**12 do on flax + jax-vmap).

    A deliberately simple lower bound: an agent holds a transition per env (the env batch)
    and the algorithm's ``stores`` ((key, transitions): a replay buffer, a rollout), each
    transition at least one observation of ``TaskSpec.observation_bytes`` (a replay buffer
    stores each once) plus TRANSITION_EXTRA_BYTES, and ``observations`` more observations
    (a replay buffer's final observations of truncated episodes); the fused jax-vmap path
    holds all ``num_seeds`` agents at once, and every path the monitor's records of every
    seed (``seed_record_bytes``).
    Weights, compiled programs and Gymnasium's per-env objects come on top. The error names
    the largest of the sizes involved.
    """
    parts = [("num_envs", cfg.num_envs), *stores]
    observation = TASKS.get(cfg.task.name).observation_bytes(cfg.task)
    transition = observation + TRANSITION_EXTRA_BYTES
    agents = agents_at_once(cfg)
    transitions, finals = agents * sum(count for _, count in parts), agents * observations
    records = cfg.num_seeds * seed_record_bytes()
    needed = transitions * transition + finals * observation + records
    available = physical_memory()
    if needed > available:
        keys = [key for key, _ in parts] + (["num_seeds"] if cfg.num_seeds > 1 else [])
        sizes = {key: _setting(cfg, key) for key in keys}
        key = max(sizes, key=sizes.__getitem__)
        held = f"{transitions:,} transitions of {transition:,} bytes"
        if finals:
            held += f" and {finals:,} final observations of {observation:,} bytes"
        held += f" and {cfg.num_seeds:,} seeds' episode records of {seed_record_bytes():,} bytes"
        raise ConfigError(
            key,
            sizes[key],
            f"a size that fits in memory: {held} need {needed / 2**30:,.1f} GiB, this machine "
            f"has {available / 2**30:,.1f} GiB",
        )


def seed_record_bytes() -> int:
    """What the run's monitor keeps of each seed, on every path: the returns and lengths
    (float64) of its last ROLLING_EPISODES episodes."""
    return 2 * ROLLING_EPISODES * 8


def agents_at_once(cfg: RunConfig) -> int:
    """Agents in one device's memory at once: the fused jax-vmap path holds every seed's, a
    share on each device where ``backend.devices`` is a count (the lanes per device of
    ``loops.lanes.LaneLayout``). Each device is counted as having the memory of its own that
    GPUs have; forced CPU devices share the host's."""
    if not ENGINES.get(cfg.env.name).needs_functional_env:
        return 1
    devices = cfg.backend.devices
    return math.ceil(cfg.num_seeds / devices) if isinstance(devices, int) else cfg.num_seeds


# The pairing that runs an algorithm's fused program (``rlspeed.config.is_fused``); every
# other pairing drives its backend's learner.
FUSED_STACK = ("flax", "jax-vmap")


def _no_extra_checks(algo_cfg: object, cfg: RunConfig) -> None:
    return None


def import_named(name: str | None) -> Any:
    """The attribute ``name`` ("package.module:attribute") names, imported on demand; None,
    a part the algorithm does not have (``AlgoSpec.check_stack`` refuses its stacks first),
    is an error."""
    if name is None:
        raise ValueError("import_named: the algorithm has no such part")
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class AlgoSpec:
    """What an algorithm declares; ``rlspeed.core.algos.loops`` trains it.

    Parts are named as "module:attribute" and imported on demand, so a torch run never
    imports flax and the reverse:
    - ``learners``: per backend, the learner class ``loops.host.HostTraining`` drives (its
      ``iteration``: collect, targets, loss, update), built as
      ``Learner(observation_space, action_space, cfg, seed)``; its module also defines
      ``load_policies`` for ``mode=eval``.
    - ``fused``: the ``make_train(cfg, env)`` of the program ``backend=flax env=jax-vmap``
      runs, the whole training in one jitted function (``loops/fused.py``); where there is
      no flax learner, its module defines flax's ``load_policies``.
    An algorithm may have only some of them (a plug-in's host learner alone, or a fused
    program alone): a stack it has no part for is refused before anything is created
    (``check_stack``).
    """

    name: str
    # Its hyperparameters and their defaults: the one place they are written.
    schema: type
    # Action-space kinds the algorithm handles: "discrete", "continuous".
    action_kinds: tuple[str, ...]
    learners: dict[str, str]
    # None: no fused program (flax + jax-vmap is refused).
    fused: str | None
    validate: Callable[[Any, Any], None] = _no_extra_checks
    # Tasks the algorithm is offered on (SPEC §4); None: every task whose action kind fits.
    tasks: tuple[str, ...] | None = None
    # Observation kinds it handles: "continuous" (Box) and "categorical" (Discrete,
    # MultiDiscrete: one-hot into a network, or a table's state index). Checked where the
    # spaces depend on the task's settings (task=gym); the built-in tasks list their algorithms.
    observation_kinds: tuple[str, ...] = ("continuous", "categorical")

    def __post_init__(self) -> None:
        if not self.learners and self.fused is None:
            raise ValueError(f"AlgoSpec {self.name!r}: no learner and no fused program")

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends with a learner driven from Python."""
        return tuple(sorted(self.learners))

    def trains_on(self, backend: str, engine: str) -> bool:
        """Whether the algorithm has a part for this stack: its fused program on the fused
        pairing, else its backend's learner."""
        if (backend, engine) == FUSED_STACK:
            return self.fused is not None
        return backend in self.learners

    def stacks(self) -> str:
        """The stacks it trains on, as an error names them."""
        fused_backend, fused_engine = FUSED_STACK
        offered = [
            f"backend={backend} with any env"
            + (f" but {fused_engine}" if backend == fused_backend else "")
            for backend in self.backends
        ]
        if self.fused is not None:
            offered.append(f"backend={fused_backend} env={fused_engine}")
        return ", ".join(offered)

    def check_stack(self, backend: str, engine: str) -> None:
        """One ConfigError line where the algorithm has no part for the stack, naming those
        it has."""
        if not self.trains_on(backend, engine):
            raise ConfigError(
                "backend",
                f"{backend} env={engine}",
                f"a stack algo={self.name} trains on: {self.stacks()}",
            )

    def backend_module(self, backend: str) -> Any:
        """The module of ``backend``'s learner (its ``load_policies`` too); a fused-only
        algorithm's flax agents load through its fused program's module."""
        part = self.learners.get(backend)
        if part is None and backend == FUSED_STACK[0]:
            part = self.fused
        if part is None:
            raise ConfigError("backend", backend, f"one of {', '.join(self.backends)}")
        return importlib.import_module(part.partition(":")[0])
