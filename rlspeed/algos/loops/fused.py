"""The fused ``backend=flax env=jax-vmap`` path, shared by every algorithm.

An algorithm's ``make_train(cfg, env)`` (its ``AlgoSpec.fused``) returns a
``FusedTrainer``: pure functions in which acting, stepping the vmapped environment,
storing and updating all happen inside one ``lax.scan``. ``FusedTrainer.train(keys)``
is a whole training as one pure function of the run's keys (``rlspeed.seeding.jax_keys``),
so ``jax.vmap`` over the keys of several seeds trains them in one program.
``train_fused`` runs it in chunks of about ``log_every`` env steps (one compiled call
each), returning to Python only to log, evaluate and draw progress. The algorithms' RL
pieces stay with the algorithms (their train states, the replay buffer's in
``rlspeed.algos.replay``); this module is the machinery around them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlspeed.algos.loops.records import log_seeds
from rlspeed.checkpoint import (
    load_pytree,
    save_pytree,
    tree_from_host,
    tree_to_host,
)
from rlspeed.config import RunConfig, TrackingConfig, TrialConfig, is_fused
from rlspeed.context import RunContext, TrainResult
from rlspeed.envs.vmap import VmapEnv, make_vmap_env
from rlspeed.errors import deferred_interrupts
from rlspeed.seeding import JaxKeys, Stream, jax_key, jax_keys
from rlspeed.tasks import Policy, TaskSpec

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlspeed.config import TaskConfigLike


class FusedTrainer(NamedTuple):
    # keys -> train state; the state has scalar fields ``step`` (env steps) and ``updates``.
    init: Callable[[JaxKeys], Any]
    # (state, iterations, valid) -> (state, stats), pure; ``iterations`` must be static,
    # ``valid`` may be traced: iterations from ``valid`` on leave the state as it is, so one
    # compiled program runs every chunk of a run, its last one included (``masked_scan``).
    # The stats have fields ``done``, ``episode_return``, ``episode_length`` of shape
    # [iterations, envs]; every stat is per iteration (leading axis) or a scalar.
    run: Callable[[Any, int, Any], tuple[Any, Any]]
    total_iterations: int
    # Env steps per iteration (num_envs, or num_envs * rollout length).
    steps_per_iteration: int
    # state -> the parameters ``greedy`` needs (not the whole state: it holds the buffers).
    policy_params: Callable[[Any], Any]
    # (policy params, observations [B, ...]) -> greedy actions [B, ...].
    greedy: Callable[[Any, jax.Array], jax.Array]
    # The seeds' chunk stats, as NumPy [seeds, ...] -> the algorithm's metrics (losses/...,
    # charts/...), one value per seed each.
    summarize: Callable[[Any], dict[str, np.ndarray]]
    # state -> the pytree saved as the checkpoint.
    checkpoint: Callable[[Any], Any] = lambda state: state.agent._asdict()

    def train(self, keys: JaxKeys) -> tuple[Any, Any]:
        """The whole training as one pure function of the keys (jit/vmap it freely)."""
        return self.run(self.init(keys), self.total_iterations, self.total_iterations)


def masked_scan(
    iteration: Callable[[Any, Any], tuple[Any, Any]],
    carry: Any,
    xs: Any,
    length: int,
    valid: Any,
    unroll: int = 1,
) -> tuple[Any, Any]:
    """``lax.scan(iteration, carry, xs, length)`` that runs only the first ``valid``
    iterations (``valid`` may be traced; None: all): the outputs of the rest are zeros. A
    run whose length is not a multiple of the chunk can run its last chunk with the same
    compiled program as the others (``train_fused`` does so on the CPU).

    No ``lax.cond``: around a whole iteration it tripled XLA:GPU's compilation of PPO's
    chunk (22.8 s against 6.5 s on an H200). With ``unroll`` 1 the loop simply stops at
    ``valid`` (a while loop, as scan lowers to, with a traced bound); ``unroll`` > 1 is for
    small carries (tabular Q-learning): every iteration runs and those past ``valid`` are
    discarded by a select."""
    if valid is None:  # every iteration runs
        return jax.lax.scan(iteration, carry, xs, length=length, unroll=unroll)
    first_x = None if xs is None else jax.tree.map(lambda x: x[0], xs)
    out_shapes = jax.eval_shape(iteration, carry, first_x)[1]
    if unroll > 1:

        def kept(carry: Any, indexed: tuple[jax.Array, Any]) -> tuple[Any, Any]:
            index, x = indexed
            new, out = iteration(carry, x)
            keep = index < valid
            new = jax.tree.map(lambda n, c: jnp.where(keep, n, c), new, carry)
            return new, jax.tree.map(lambda o: jnp.where(keep, o, jnp.zeros_like(o)), out)

        indices = jnp.arange(length)
        return jax.lax.scan(kept, carry, (indices, xs), length=length, unroll=unroll)

    outs = jax.tree.map(lambda s: jnp.zeros((length, *s.shape), s.dtype), out_shapes)

    def body(index: jax.Array, state: tuple[Any, Any]) -> tuple[Any, Any]:
        carry, outs = state
        x = None if xs is None else jax.tree.map(lambda x: x[index], xs)
        carry, out = iteration(carry, x)
        return carry, jax.tree.map(lambda buf, o: buf.at[index].set(o), outs, out)

    return jax.lax.fori_loop(0, valid, body, (carry, outs))


def scan_iterations(
    iteration: Callable[[Any, None], tuple[Any, Any]],
) -> Callable[[Any, int, Any], tuple[Any, Any]]:
    """A ``FusedTrainer.run`` that repeats ``iteration(state, None) -> (state, stats)``."""

    def run(state: Any, iterations: int, valid: Any) -> tuple[Any, Any]:
        return masked_scan(iteration, state, None, iterations, valid)

    return run


def saved_agent_policies(
    cfg: DictConfig,
    path: Path,
    init: Callable[[jax.Array], Any],
    params_field: str,
    greedy: Callable[[Any, jax.Array], jax.Array],
) -> list[Policy]:
    """``saved_policies`` of a checkpoint of the agent NamedTuple ``init`` makes, whose field
    ``params_field`` holds what ``greedy`` takes."""
    template = init(jax.random.key(0))._asdict()
    return saved_policies(cfg, path, template, lambda agent: agent[params_field], greedy)


# XLA options for a program that runs once (the init): its machine code need not be fast,
# and skipping LLVM's optimizations takes ~0.4 s off the start of a DQN run (1.2 -> 0.8 s).
RUN_ONCE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def scan_unroll(batch: int) -> int:
    """How many loop iterations ``lax.scan`` should unroll when each one works on
    ``batch`` numbers in all (envs x vmapped seeds). XLA:CPU pays a fixed cost per loop
    iteration that dominates small bodies; unrolling 4 amortizes it (tabular Q-learning,
    30 agents x 1 env: 4.0 M -> 5.6 M agent-steps/s) but slows large ones (256 x 1:
    8.8 M -> 7.6 M), where the extra code costs more than the loop."""
    return 4 if batch <= 128 else 1


def saved_policies(
    cfg: DictConfig,
    path: Path,
    template: Any,
    params_of: Callable[[Any], Any],
    greedy: Callable[[Any, jax.Array], jax.Array],
) -> list[Policy]:
    """The greedy policies of a flax checkpoint (``mode=eval``): one per agent it holds
    (every seed of a fused run, stacked). ``template``: a checkpoint tree of one agent."""
    agents = cfg.num_seeds if is_fused(cfg) else 1
    params = params_of(load_pytree(template, path, agents))
    compiled = jax.jit(greedy)
    if agents == 1:
        return [DevicePolicy(greedy, compiled, params)]
    return [
        DevicePolicy(greedy, compiled, jax.tree.map(lambda x, i=i: x[i], params))
        for i in range(agents)
    ]


class DevicePolicy:
    """The greedy policy of saved parameters: a host ``Policy`` (NumPy observations in,
    actions out: the host's evaluation, videos) that ``device_score`` can also trace."""

    def __init__(self, greedy: Callable[[Any, jax.Array], jax.Array], compiled: Any, params: Any):
        self.greedy, self._compiled, self.params = greedy, compiled, params

    def __call__(self, obs: Any) -> np.ndarray:
        return np.asarray(self._compiled(self.params, obs))


def _scorer(
    task: TaskSpec, task_cfg: TaskConfigLike, greedy: Callable[[Any, jax.Array], jax.Array]
) -> Callable[[Any, jax.Array], jax.Array]:
    """(policy params, evaluation key) -> the agent's score on the task's JAX twin."""
    evaluate = task.evaluate_on_device
    assert evaluate is not None

    def score(params: Any, key: jax.Array) -> jax.Array:
        return evaluate(task_cfg, partial(greedy, params), key)

    return score


def device_score(
    task: TaskSpec, task_cfg: TaskConfigLike, policy: DevicePolicy, seed: int
) -> float:
    """The score ``train_fused`` gives the agent of seed ``seed`` (mode=eval of a fused run)."""
    score = jax.jit(_scorer(task, task_cfg, policy.greedy))
    return float(score(policy.params, jax_key(seed, Stream.EVAL)))


def _lane_scores(
    ctxs: list[RunContext], trainer: FusedTrainer, programs: dict[Any, Any]
) -> Callable[[Any], np.ndarray]:
    """(every lane's policy params, stacked where there are several) -> every lane's score
    (lane ``t * num_seeds + i``: seed ``i`` of run ``t``): on the task's JAX twin in one
    compiled call (vmapped over lanes); on the host, for a task with no device evaluation,
    one evaluation per lane."""
    first = ctxs[0]
    task, seeds = first.task, first.cfg.num_seeds
    lane_seeds = [ctx.cfg.seed + i for ctx in ctxs for i in range(seeds)]
    lane_tasks = [ctx.cfg.task for ctx in ctxs for _ in range(seeds)]
    if task.evaluate_on_device is None:
        greedy = programs.setdefault("greedy", jax.jit(trainer.greedy))

        def on_host(params: Any) -> np.ndarray:
            def policy(index: int) -> Callable[[Any], np.ndarray]:
                agent = params if len(lane_seeds) == 1 else jax.tree.map(lambda x: x[index], params)
                return lambda obs: np.asarray(greedy(agent, obs))

            return np.array(
                [
                    task.evaluate(task_cfg, policy(i), seed)
                    for i, (task_cfg, seed) in enumerate(zip(lane_tasks, lane_seeds, strict=True))
                ]
            )

        return on_host
    score = _scorer(task, first.cfg.task, trainer.greedy)
    if len(lane_seeds) == 1:  # as mode=eval scores it (device_score)
        one = programs.setdefault("score", jax.jit(score))
        key = jax_key(lane_seeds[0], Stream.EVAL)
        return lambda params: np.atleast_1d(np.asarray(one(params, key)))
    every = programs.setdefault("score", jax.jit(jax.vmap(score)))
    keys = jax_key(lane_seeds, Stream.EVAL)
    return lambda params: np.asarray(every(params, keys))


def first_iterations(stats: Any, count: int) -> Any:
    """The chunk's stats [seeds, iterations, ...] of their first ``count`` iterations."""
    return jax.tree.map(lambda x: x[:, :count] if x.ndim > 1 else x, stats)


def per_seed_sum(values: Any) -> np.ndarray:
    """Each seed's sum of a chunk's stat [seeds, ...] (every axis after the first), float64."""
    values = np.asarray(values, dtype=np.float64)
    return values.reshape(len(values), -1).sum(axis=1)


def per_seed_mean(values: Any) -> np.ndarray:
    """Each seed's mean of a chunk's stat [seeds, ...], float64."""
    values = np.asarray(values, dtype=np.float64)
    return values.reshape(len(values), -1).mean(axis=1)


def chunk_length(target: int, total: int, masked: bool) -> int:
    """Iterations per compiled call: ``target`` (``log_every``'s), at most the run's
    ``total``. Where a shorter last chunk would need a program of its own (not ``masked``),
    the largest divisor of ``total`` above ``target / 2`` if there is one: every chunk is
    then one program, logged at most twice as often as asked."""
    chunk = min(max(1, target), total)
    if masked:
        return chunk
    return next((d for d in range(chunk, chunk // 2, -1) if total % d == 0), chunk)


def traced_hparams(algo: Any) -> dict[str, Any]:
    """The values of the algorithm's traced hyperparameters (its config class's ``TRACED``
    names): inputs of the fused program, not constants compiled into it, so runs that differ
    only in them share one program, and a sweep's trials can be lanes of one."""
    return {name: np.float32(getattr(algo, name)) for name in type(algo).TRACED}


def with_hparams(cfg: RunConfig, values: dict[str, Any]) -> RunConfig:
    """``cfg`` with the algorithm's traced hyperparameters set to ``values`` (tracers, where
    ``make_train`` is called inside a jitted function)."""
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, **values))


# Compiled programs of earlier runs in this process, by what they are a function of: a
# sweep's next trial or batch with the same static config reuses them instead of tracing
# its program again (~3 s for tabular Q-learning's 16 lanes). The latest few are kept.
_PROGRAMS: dict[str, dict[Any, Any]] = {}
_KEPT_PROGRAMS = 4


def _programs(make_train: Callable[..., Any], cfg: RunConfig, lanes: int) -> dict[Any, Any]:
    """The cache of programs of runs like ``cfg`` with ``lanes`` lanes: configs equal but
    for traced hyperparameters and what no program reads (seed: keys are inputs; the
    trial, tracking, progress, outputs)."""
    algo = dataclasses.replace(cfg.algo, **dict.fromkeys(type(cfg.algo).TRACED, 0.0))
    static = dataclasses.replace(
        cfg,
        algo=algo,
        seed=0,
        trial=TrialConfig(),
        tracking=TrackingConfig(),
        progress="",
        checkpoint_every=0,
    )
    key = f"{make_train.__module__}.{make_train.__qualname__}/{lanes}/{static!r}"
    if key not in _PROGRAMS:
        while len(_PROGRAMS) >= _KEPT_PROGRAMS:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[key] = {}
    return _PROGRAMS[key]


def train_fused(ctx: RunContext, make_train: Callable[[Any, VmapEnv], FusedTrainer]) -> TrainResult:
    """Train ``num_seeds`` agents as one program: vmap over seeds when there are several."""
    (outcome,) = train_fused_runs([ctx], make_train)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def train_fused_runs(
    ctxs: list[RunContext], make_train: Callable[[Any, VmapEnv], FusedTrainer]
) -> list[TrainResult | Exception]:
    """Train the runs ``ctxs`` as one program: one run, or a sweep's trials whose configs
    differ only in traced hyperparameters (``traced_hparams``). Every agent (``num_seeds``
    per run) is a lane of one vmapped train state; the runs' hyperparameters are inputs, per
    lane. A run whose log raises (its trial pruned, its loss not finite) ends there with
    that exception: its lanes are frozen (their state kept as it was at that chunk's end)
    and its results no longer read, while the others train on. Lanes run in lockstep, so a
    frozen lane's work is still done: it is neither refilled nor repacked (a new lane count
    is a new program to compile). Returns each run's result, or the exception it ended
    with; an interrupt ends them all."""
    first = ctxs[0]
    cfg, seeds = first.cfg, first.cfg.num_seeds
    lanes = len(ctxs) * seeds
    batched = len(ctxs) > 1
    assert not (batched and any(ctx.resumed for ctx in ctxs)), "a batch of runs starts fresh"
    # Until the first chunk returns, the time goes to compiling the whole program.
    for ctx in ctxs:
        ctx.run_monitor.compiling()
    env = make_vmap_env(first.task, cfg.task, cfg.num_envs)

    def trainer_with(values: dict[str, Any]) -> FusedTrainer:
        return make_train(with_hparams(cfg, values), env)

    hparams = [traced_hparams(ctx.cfg.algo) for ctx in ctxs]
    # Sizes, the greedy policy and the summaries read no traced value: any run's will do.
    trainer = trainer_with(hparams[0])
    lane_hparams: Any = (
        {name: np.repeat([h[name] for h in hparams], seeds) for name in hparams[0]}
        if lanes > 1
        else hparams[0]
    )
    programs = _programs(make_train, cfg, lanes)
    policy_params = programs.setdefault("policy_params", jax.jit(trainer.policy_params))
    # XLA:CPU compiles a loop with a traced bound (masked_scan) as fast as a fixed-length
    # scan, so there one program runs every chunk, a shorter last one included (a second
    # program for it cost 0.4-6 s of compilation). XLA:GPU took 3x as long over it (PPO's
    # chunk on an H200: 27.9 s against 8.6 s), more than a second program costs: there
    # the chunk divides the run where it can, else a shorter last chunk gets a fixed-length
    # program of its own.
    masked = jax.default_backend() == "cpu"
    target = math.ceil(cfg.log_every / trainer.steps_per_iteration)
    chunk = chunk_length(target, trainer.total_iterations, masked)
    # Per lane: whether its run still trains (a batch's frozen lanes keep their state).
    live = np.ones(lanes, dtype=bool)

    def run(state: Any, iterations: int) -> tuple[Any, Any]:
        length = chunk if masked else iterations
        if ("chunk", length, masked) not in programs:

            def run_chunk(
                state: Any, valid: jax.Array, values: Any, live: Any, length: int = length
            ) -> Any:
                new, stats = trainer_with(values).run(state, length, valid if masked else None)
                if batched:  # a stopped run's lanes keep their state
                    new = jax.tree.map(lambda n, o: jnp.where(live, n, o), new, state)
                return new, stats

            vmapped = jax.vmap(run_chunk, in_axes=(0, None, 0, 0)) if lanes > 1 else run_chunk
            programs["chunk", length, masked] = jax.jit(vmapped)
        return programs["chunk", length, masked](state, np.int32(iterations), lane_hparams, live)

    def init(keys: JaxKeys, values: Any) -> Any:
        return trainer_with(values).init(keys)

    if "init" not in programs:
        programs["init"] = jax.jit(
            init if lanes == 1 else jax.vmap(init), compiler_options=RUN_ONCE
        )
    if lanes == 1:
        state = programs["init"](jax_keys(cfg.seed), lane_hparams)

        def with_lane_axis(tree: Any) -> Any:
            return jax.tree.map(lambda x: np.asarray(x)[None], tree)
    else:
        # Lane t * seeds + i gets the keys of a single run with run t's seed + i.
        keys = jax_keys([ctx.cfg.seed + i for ctx in ctxs for i in range(seeds)])
        state = programs["init"](keys, lane_hparams)

        def with_lane_axis(tree: Any) -> Any:
            return tree

    scores_of = _lane_scores(ctxs, trainer, programs)
    every_seed = np.arange(seeds)
    # Run t's lanes, and its part of a tree with a lane axis (a lone seed's without it,
    # as a lone run saves it).
    lanes_of = [slice(t * seeds, (t + 1) * seeds) for t in range(len(ctxs))]

    def part(tree: Any, t: int) -> Any:
        if not batched:  # the run's whole state, as it is
            return tree
        # The start as an array: an index that is a new constant compiles a program each.
        start = jnp.int32(t * seeds)
        if seeds == 1:
            return jax.tree.map(lambda x: x[start], tree)
        return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, seeds), tree)

    done_iterations = 0
    resumed = first.resume_state()
    if resumed is not None:  # the whole train state: agents, replay buffers, envs, keys
        state = tree_from_host(state, resumed["state"])
        done_iterations = resumed["iterations"]
    # Per run: the state after its last whole chunk, and its iteration count.
    latest = [{"state": state, "iterations": done_iterations} for _ in ctxs]
    outcomes: list[TrainResult | Exception | None] = [None] * len(ctxs)
    schedules = []
    for t, ctx in enumerate(ctxs):
        ctx.all_seeds = True
        ctx.set_checkpoint(
            "checkpoint.msgpack",
            partial(_save_agents, trainer, part, latest[t], t),
            partial(_resume_state, part, latest[t], t),
        )
        schedules.append(ctx.checkpoint_schedule())
        schedules[t].start(done_iterations * trainer.steps_per_iteration)
    with deferred_interrupts() as check_interrupt:
        while done_iterations < trainer.total_iterations and live.any():
            iterations = min(chunk, trainer.total_iterations - done_iterations)
            called = time.perf_counter()
            state, stats = run(state, iterations)
            done_iterations += iterations
            # One transfer; from here on every lane is a row of the same arrays.
            fetched = jax.device_get((stats, state.step, state.updates))
            stats, steps, updates = with_lane_axis(fetched)
            seconds = time.perf_counter() - called
            if masked and iterations < chunk:
                stats = first_iterations(stats, iterations)
            # Evaluated once for every lane, when the first run is due (all are at once).
            scores = cache(partial(_scores_at, scores_of, policy_params, state))
            for t, ctx in enumerate(ctxs):
                if outcomes[t] is not None:
                    continue
                monitor, mine = ctx.run_monitor, lanes_of[t]
                monitor.compiled_calls_s = (monitor.compiled_calls_s or 0.0) + seconds
                run_stats = jax.tree.map(lambda x, mine=mine: x[mine], stats)
                monitor.every_seed_episodes(
                    run_stats.done, run_stats.episode_return, run_stats.episode_length
                )
                try:
                    log_seeds(
                        ctx,
                        every_seed,
                        steps[mine],
                        updates[mine],
                        trainer.summarize(run_stats),
                        # Called only when an evaluation is due.
                        partial(_lanes_of, scores, mine),
                    )
                except Exception as error:  # noqa: BLE001 - this run's end, not the batch's
                    if not batched:
                        raise
                    # Its checkpoint keeps the agents of its last logged chunk, as a lone
                    # run's does when its log raises.
                    outcomes[t] = error
                    live[mine] = False
                    continue
                latest[t].update(state=state, iterations=done_iterations)
                schedules[t].reached(done_iterations * trainer.steps_per_iteration)
            check_interrupt()
    return [
        outcome if outcome is not None else _result(part(latest[t]["state"], t))
        for t, outcome in enumerate(outcomes)
    ]


def _lanes_of(values: Callable[[], np.ndarray], lanes: slice) -> np.ndarray:
    """The ``lanes`` of ``values()``."""
    return values()[lanes]


def _save_agents(
    trainer: FusedTrainer,
    part: Callable[[Any, int], Any],
    latest: dict[str, Any],
    t: int,
    path: Path,
) -> Path:
    """Save run ``t``'s agents as of its latest whole chunk (its checkpoint file)."""
    return save_pytree(trainer.checkpoint(part(latest["state"], t)), path)


def _resume_state(
    part: Callable[[Any, int], Any], latest: dict[str, Any], t: int
) -> dict[str, Any]:
    """Run ``t``'s whole train state as of its latest whole chunk, to resume from."""
    return {"state": tree_to_host(part(latest["state"], t)), "iterations": latest["iterations"]}


def _result(state: Any) -> TrainResult:
    """A run's env steps and updates, summed over its agents."""
    steps, updates = (int(np.sum(x)) for x in jax.device_get((state.step, state.updates)))
    return TrainResult(steps=steps, updates=updates)


def _scores_at(
    scores_of: Callable[[Any], np.ndarray], policy_params: Callable[[Any], Any], state: Any
) -> np.ndarray:
    """Every seed's score with the policy parameters of train state ``state``."""
    return scores_of(policy_params(state))
