"""A fused program trained in chunks: ``FusedTraining.chunks()`` runs an algorithm's
``FusedTrainer`` (``fused.py``) one compiled call of about ``log_every`` env steps at a time
and yields what each call did, per run: steps, updates, episodes, metrics and, when asked,
scores. Every agent of every run is a lane of one vmapped train state (a run's
``num_seeds``; a sweep's trials whose configs differ only in traced hyperparameters, which
are inputs per lane), spread over the devices it is given (``lanes.LaneLayout``). The run
(``rlspeed.run``) records each chunk, says which runs it
keeps (``accept``) and which stop (``stop``: a pruned trial's lanes are frozen), and saves
what ``agents``/``resume_state`` return; nothing here records or writes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from functools import cache, partial
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlspeed.config import RunConfig, TrackingConfig, TrialConfig
from rlspeed.core.algos.loops import TrainResult
from rlspeed.core.algos.loops.fused import (
    RUN_ONCE,
    DevicePolicy,
    FusedTrainer,
    device_policies,
    first_iterations,
)
from rlspeed.core.algos.loops.lanes import LaneLayout
from rlspeed.core.envs.vmap import VmapEnv, make_vmap_env
from rlspeed.core.state import tree_from_host, tree_to_host, written_parts
from rlspeed.core.tasks import TaskSpec
from rlspeed.seeding import JaxKeys, Stream, jax_key, jax_keys

if TYPE_CHECKING:
    from jax.typing import ArrayLike

    from rlspeed.config import TaskConfig
    from rlspeed.core import AgentCheckpoint, PyTree

    # The traced hyperparameters by name (``traced_values``): NumPy numbers, or arrays of
    # one per lane, on the host; tracers inside the program.
    HParams = Mapping[str, ArrayLike]

MakeTrain = Callable[[RunConfig, VmapEnv], FusedTrainer]


class RunChunk(NamedTuple):
    """One run's part of a compiled call: per agent (seed) of the run."""

    steps: np.ndarray
    updates: np.ndarray
    # [seeds, iterations, envs]: the episodes that ended.
    done: np.ndarray
    episode_return: np.ndarray
    episode_length: np.ndarray
    # The algorithm's metrics (losses/..., charts/...), one value per seed each.
    metrics: dict[str, np.ndarray]
    # The seeds' greedy scores, computed when first called (one call for every run's lanes).
    scores: Callable[[], np.ndarray]


class FusedChunk(NamedTuple):
    # Seconds the compiled call took (its first includes compiling the program).
    seconds: float
    # By run index: the runs still training.
    runs: dict[int, RunChunk]


class FusedTraining:
    """Runs ``cfgs`` (one run, or a sweep's trials equal but for traced hyperparameters and
    seeds) as one program; ``resumed`` (one run only) continues a saved ``resume_state``;
    ``initial``: the weights every agent starts from (``init_from=``), else its seed's.
    ``devices``: where the lanes run (None: JAX's default device). What it saves and
    resumes from is the same whatever the devices."""

    def __init__(
        self,
        cfgs: list[RunConfig],
        task: TaskSpec,
        make_train: MakeTrain,
        resumed: dict[str, Any] | None = None,
        devices: Sequence[jax.Device] | None = None,
        initial: AgentCheckpoint | None = None,
    ) -> None:
        cfg, seeds = cfgs[0], cfgs[0].num_seeds
        assert not (len(cfgs) > 1 and resumed is not None), "a batch of runs starts fresh"
        self.cfgs, self.seeds, self.batched = cfgs, seeds, len(cfgs) > 1
        self.lanes = len(cfgs) * seeds
        self.layout = layout = LaneLayout(self.lanes, devices or jax.devices()[:1])
        env = make_vmap_env(task, cfg.task, cfg.num_envs)

        def make(values: HParams) -> FusedTrainer:
            run = with_values(cfg, task, values)
            if run.task is cfg.task:
                return make_train(run, env)
            # Traced env params: the env of these values (a twin of the run's, its spaces).
            return make_train(run, make_vmap_env(task, run.task, cfg.num_envs))

        self._make = make
        hparams = [traced_values(run, task) for run in cfgs]
        # Sizes, the greedy policy and the summaries read no traced value: any run's will do.
        self.trainer = trainer = self._make(hparams[0])
        self._hparams: HParams = (
            layout.pad({name: np.repeat([h[name] for h in hparams], seeds) for name in hparams[0]})
            if self.lanes > 1
            else hparams[0]
        )
        self._programs = programs = _programs(make_train, cfg, task, layout)
        self._policy_params = programs.setdefault("policy_params", jax.jit(trainer.policy_params))
        # XLA:CPU compiles a loop with a traced bound (masked_scan) as fast as a
        # fixed-length scan, so there one program runs every chunk, a shorter last one
        # included (a second program for it cost 0.4-6 s of compilation). XLA:GPU took 3x
        # as long over it (PPO's chunk on an H200: 27.9 s against 8.6 s), more than a
        # second program costs: there the chunk divides the run where it can, else a
        # shorter last chunk gets a fixed-length program of its own.
        self._masked = jax.default_backend() == "cpu"
        target = math.ceil(cfg.log_every / trainer.steps_per_iteration)
        self._chunk = chunk_length(target, trainer.total_iterations, self._masked)
        # Per lane: whether its run still trains (frozen lanes keep their state: a batch's
        # stopped runs, the padding).
        self._live = np.arange(layout.padded) < self.lanes
        lane_seeds = [run.seed + i for run in cfgs for i in range(seeds)]
        lane_tasks = [run.task for run in cfgs for _ in range(seeds)]
        self._scores_of = _lane_scores(task, lane_tasks, lane_seeds, trainer, programs, layout)
        self._resumed, self._initial = resumed, initial
        self.iterations = resumed["iterations"] if resumed is not None else 0
        self._state: PyTree = None
        # Per run: the state after its last accepted chunk, and its iteration count.
        self._kept: list[tuple[PyTree, int]] = []

    @property
    def step(self) -> int:
        """Env steps per agent so far (where the training starts, before its chunks)."""
        return self.iterations * self.trainer.steps_per_iteration

    def chunks(self) -> Generator[FusedChunk, None, None]:
        """Train, yielding after each compiled call, until the runs end or all are stopped."""
        trainer, seeds = self.trainer, self.seeds
        self._state = self._init()
        self._kept = [(self._state, self.iterations) for _ in self.cfgs]
        lanes_of = [slice(t * seeds, (t + 1) * seeds) for t in range(len(self.cfgs))]
        while self.iterations < trainer.total_iterations and self._live.any():
            iterations = min(self._chunk, trainer.total_iterations - self.iterations)
            called = time.perf_counter()
            self._state, stats = self._run(self._state, iterations)
            self.iterations += iterations
            # One transfer; from here on every lane is a row of the same arrays.
            fetched = jax.device_get((stats, self._state.step, self._state.updates))
            if self.lanes == 1:
                fetched = jax.tree.map(lambda x: np.asarray(x)[None], fetched)
            stats, steps, updates = fetched
            seconds = time.perf_counter() - called
            if self._masked and iterations < self._chunk:
                stats = first_iterations(stats, iterations)
            # Evaluated once for every lane, when the first run asks (all are due at once).
            scores = cache(partial(self._scores_at, self._state))
            runs = {}
            for t, mine in enumerate(lanes_of):
                if not self._live[mine].any():
                    continue
                run_stats = jax.tree.map(lambda x, mine=mine: x[mine], stats)
                runs[t] = RunChunk(
                    steps[mine],
                    updates[mine],
                    run_stats.done,
                    run_stats.episode_return,
                    run_stats.episode_length,
                    trainer.summarize(run_stats),
                    partial(_lanes_of, scores, mine),
                )
            yield FusedChunk(seconds, runs)

    def accept(self, run: int) -> None:
        """Run ``run`` has recorded the last chunk: its agents as of then are what it keeps."""
        self._kept[run] = (self._state, self.iterations)

    def stop(self, run: int) -> None:
        """Run ``run`` ends here, keeping its last accepted chunk; its lanes are frozen and
        its results no longer read, while the batch's other runs train on. Lanes run in
        lockstep, so a frozen lane's work is still done: it is neither refilled nor
        repacked (a new lane count is a new program to compile)."""
        self._live[run * self.seeds : (run + 1) * self.seeds] = False

    def agents(self, run: int) -> PyTree:
        """Run ``run``'s agents as of its last accepted chunk: the checkpoint's pytree."""
        return self.trainer.checkpoint(self._part(self._kept[run][0], run))

    def policies(self, run: int) -> list[DevicePolicy]:
        """Run ``run``'s greedy policies, one per seed, as of its last accepted chunk (NumPy
        observations in, actions out)."""
        params = self._policy_params(self._part(self._kept[run][0], run))
        greedy = self.trainer.greedy
        compiled = self._programs.setdefault("greedy", jax.jit(greedy))
        return device_policies(greedy, compiled, params, self.seeds)

    def resume_state(self, run: int) -> dict[str, Any]:
        """Run ``run``'s whole train state as of its last accepted chunk, to resume from:
        agents, replay buffers, envs, keys."""
        state, iterations = self._kept[run]
        # A replay buffer as far as it is written: a run 1% into its buffer saves 1% of it.
        state = written_parts(self._part(state, run), self.cfgs[run].num_envs)
        return {"state": tree_to_host(state), "iterations": iterations}

    def result(self, run: int) -> TrainResult:
        """Run ``run``'s env steps and updates, summed over its agents."""
        state = self._part(self._kept[run][0], run)
        steps, updates = (int(np.sum(x)) for x in jax.device_get((state.step, state.updates)))
        return TrainResult(steps=steps, updates=updates)

    @property
    def devices(self) -> list[str]:
        """The devices the lanes run on (``platform:id``)."""
        return self.layout.names

    def _init(self) -> PyTree:
        programs, layout = self._programs, self.layout

        def init(keys: JaxKeys, values: HParams) -> PyTree:
            return self._make(values).init(keys)

        if "init" not in programs:
            program = init if self.lanes == 1 else layout.spread(jax.vmap(init), (True, True))
            programs["init"] = jax.jit(program, compiler_options=RUN_ONCE)
        # Lane t * seeds + i gets the keys of a single run with run t's seed + i.
        seeds = layout.padded_list([run.seed + i for run in self.cfgs for i in range(self.seeds)])
        keys = jax_keys(seeds[0] if self.lanes == 1 else seeds)
        state = programs["init"](keys, self._hparams)
        if self._initial is not None:
            start = self.trainer.start_from
            if self.lanes > 1:  # every lane's agent from the same weights
                start = jax.vmap(start, in_axes=(0, None))
            state = start(state, self._initial)
        if self._resumed is not None:  # saved without padding, whatever the devices were
            restored = tree_from_host(layout.real(state), self._resumed["state"])
            state = layout.place(layout.pad(restored))
        return state

    def _run(self, state: PyTree, iterations: int) -> tuple[PyTree, PyTree]:
        masked, programs = self._masked, self._programs
        length = self._chunk if masked else iterations
        if ("chunk", length, masked) not in programs:
            freezes, make = self.batched or self.layout.padded > self.lanes, self._make

            def run_chunk(
                state: PyTree, valid: jax.Array, values: HParams, live: jax.Array
            ) -> tuple[PyTree, PyTree]:
                new, stats = make(values).run(state, length, valid if masked else None)
                if freezes:  # a stopped run's lanes, and padded ones, keep their state
                    new = jax.tree.map(lambda n, o: jnp.where(live, n, o), new, state)
                return new, stats

            program = run_chunk
            if self.lanes > 1:
                vmapped = jax.vmap(run_chunk, in_axes=(0, None, 0, 0))
                program = self.layout.spread(vmapped, (True, False, True, True))
            programs["chunk", length, masked] = jax.jit(program)
        chunk = programs["chunk", length, masked]
        ran: tuple[PyTree, PyTree] = chunk(state, np.int32(iterations), self._hparams, self._live)
        return ran

    def _part(self, tree: PyTree, run: int) -> PyTree:
        """Run ``run``'s part of a tree with a lane axis (a lone run's tree as it is, but for
        padded lanes)."""
        if not self.batched:
            return self.layout.real(tree)
        # The start as an array: an index that is a new constant compiles a program each.
        start = jnp.int32(run * self.seeds)
        if self.seeds == 1:
            return jax.tree.map(lambda x: x[start], tree)
        return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, self.seeds), tree)

    def _scores_at(self, state: PyTree) -> np.ndarray:
        """Every lane's score with the policy parameters of train state ``state``."""
        return self._scores_of(self._policy_params(state))


def _lanes_of(values: Callable[[], np.ndarray], lanes: slice) -> np.ndarray:
    """The ``lanes`` of ``values()``."""
    return values()[lanes]


def _scorer(
    task: TaskSpec, task_cfg: TaskConfig, greedy: Callable[[PyTree, jax.Array], jax.Array]
) -> Callable[[PyTree, jax.Array, HParams], jax.Array]:
    """(policy params, evaluation key, the task's traced values) -> the agent's score on the
    task's JAX twin, with those values (its env params: a lane's own)."""
    evaluate = task.evaluate_on_device
    assert evaluate is not None

    def score(params: PyTree, key: jax.Array, values: HParams) -> jax.Array:
        scored = task.with_traced(task_cfg, values) if values else task_cfg
        scores: jax.Array = evaluate(scored, partial(greedy, params), key)
        return scores

    return score


def device_score(task: TaskSpec, task_cfg: TaskConfig, policy: DevicePolicy, seed: int) -> float:
    """The score ``FusedTraining`` gives the agent of seed ``seed`` (mode=eval of a fused run)."""
    score = jax.jit(_scorer(task, task_cfg, policy.greedy))
    return float(score(policy.params, jax_key(seed, Stream.EVAL), {}))


def _lane_scores(
    task: TaskSpec,
    lane_tasks: list[TaskConfig],
    lane_seeds: list[int],
    trainer: FusedTrainer,
    programs: dict[Any, Any],
    layout: LaneLayout,
) -> Callable[[PyTree], np.ndarray]:
    """(every lane's policy params, stacked where there are several) -> every lane's score
    (lane ``t * num_seeds + i``: seed ``i`` of run ``t``; padded lanes of ``layout`` too, on
    the device): on the task's JAX twin in one compiled call (vmapped over lanes, each with
    its own traced env params); on the host, for a task with no device evaluation, one
    evaluation per real lane."""
    if task.evaluate_on_device is None:
        greedy = programs.setdefault("greedy", jax.jit(trainer.greedy))

        def on_host(params: PyTree) -> np.ndarray:
            def policy(index: int) -> Callable[[np.ndarray], np.ndarray]:
                agent = params if len(lane_seeds) == 1 else jax.tree.map(lambda x: x[index], params)
                return lambda obs: np.asarray(greedy(agent, obs))

            return np.array(
                [
                    task.evaluate(task_cfg, policy(i), seed)
                    for i, (task_cfg, seed) in enumerate(zip(lane_tasks, lane_seeds, strict=True))
                ]
            )

        return on_host
    score = _scorer(task, lane_tasks[0], trainer.greedy)
    traced = [task.traced(lane) for lane in lane_tasks]
    if len(lane_seeds) == 1:  # as mode=eval scores it (device_score)
        one = programs.setdefault("score", jax.jit(score))
        key = jax_key(lane_seeds[0], Stream.EVAL)
        return lambda params: np.atleast_1d(np.asarray(one(params, key, traced[0])))
    every = programs.setdefault("score", jax.jit(jax.vmap(score)))
    keys = jax_key(layout.padded_list(lane_seeds), Stream.EVAL)
    traced = layout.padded_list(traced)
    values = {name: np.array([lane[name] for lane in traced], np.float32) for name in traced[0]}
    return lambda params: np.asarray(every(params, keys, values))


def chunk_length(target: int, total: int, masked: bool) -> int:
    """Iterations per compiled call: ``target`` (``log_every``'s), at most the run's
    ``total``. Where a shorter last chunk would need a program of its own (not ``masked``),
    the largest divisor of ``total`` above ``target / 2`` if there is one: every chunk is
    then one program, logged at most twice as often as asked."""
    chunk = min(max(1, target), total)
    if masked:
        return chunk
    return next((d for d in range(chunk, chunk // 2, -1) if total % d == 0), chunk)


def traced_values(run: RunConfig, task: TaskSpec) -> dict[str, Any]:
    """The values that are inputs of the fused program, not constants compiled into it: the
    algorithm's traced hyperparameters (its config class's ``TRACED`` names) and the task's
    traced settings (``TaskSpec.traced``, as ``task.<name>``). Runs that differ only in them
    share one program, and a sweep's trials can be lanes of one."""
    algo = {name: np.float32(getattr(run.algo, name)) for name in type(run.algo).TRACED}
    settings = {f"task.{name}": np.float32(v) for name, v in task.traced(run.task).items()}
    return {**algo, **settings}


def with_values(cfg: RunConfig, task: TaskSpec, values: HParams) -> RunConfig:
    """``cfg`` with the traced ``values`` (``traced_values``' names; tracers, where
    ``make_train`` is called inside a jitted function)."""
    settings = {k.removeprefix("task."): v for k, v in values.items() if k.startswith("task.")}
    algo = {name: value for name, value in values.items() if not name.startswith("task.")}
    run_task = task.with_traced(cfg.task, settings) if settings else cfg.task
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, **algo), task=run_task)


# Compiled programs of earlier runs in this process, by what they are a function of: a
# sweep's next trial or batch with the same static config reuses them instead of tracing
# its program again (~3 s for tabular Q-learning's 16 lanes). The latest few are kept.
_PROGRAMS: dict[str, dict[Any, Any]] = {}
_KEPT_PROGRAMS = 4


def _programs(
    make_train: Callable[..., Any], cfg: RunConfig, task: TaskSpec, layout: LaneLayout
) -> dict[Any, Any]:
    """The cache of programs of runs like ``cfg`` with lanes laid out as ``layout``: configs
    equal but for traced values and what no program reads (seed: keys are inputs; the
    trial, tracking, progress, outputs; how many devices the config allowed)."""
    unset = dict.fromkeys(traced_values(cfg, task), 0.0)
    static = dataclasses.replace(
        with_values(cfg, task, unset),
        seed=0,
        trial=TrialConfig(),
        tracking=TrackingConfig(),
        progress="",
        checkpoint_every=0,
        backend=dataclasses.replace(cfg.backend, devices="all"),
    )
    lanes = f"{layout.lanes}/{layout.padded}/{','.join(layout.names)}"
    key = f"{make_train.__module__}.{make_train.__qualname__}/{lanes}/{static!r}"
    if key not in _PROGRAMS:
        while len(_PROGRAMS) >= _KEPT_PROGRAMS:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[key] = {}
    return _PROGRAMS[key]
