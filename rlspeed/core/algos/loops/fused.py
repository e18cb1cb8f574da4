"""The fused ``backend=flax env=jax-vmap`` path's contract with the algorithms.

An algorithm's ``make_train(cfg, env)`` (its ``AlgoSpec.fused``) returns a
``FusedTrainer``: pure functions in which acting, stepping the vmapped environment,
storing and updating all happen inside one ``lax.scan``. ``FusedTrainer.train(keys)``
is a whole training as one pure function of the run's keys (``rlspeed.seeding.jax_keys``),
so ``jax.vmap`` over the keys of several seeds trains them in one program.
``fused_training.FusedTraining`` runs it in chunks of about ``log_every`` env steps (one
compiled call each). The algorithms' RL pieces stay with the algorithms (their train
states, the replay buffer's in ``rlspeed.core.algos.replay_jax``); this module holds what they
build on: the masked scan, the trainer's shape, the policies of a saved checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from rlspeed.config import is_fused
from rlspeed.core.state import agents_from_saved, with_weights
from rlspeed.core.tasks import Policy
from rlspeed.seeding import JaxKeys

if TYPE_CHECKING:
    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, PyTree, XpArray

    # How many of a scan's iterations run: a number (maybe traced), or None for all of them.
    Valid = int | jax.Array | None


class FusedTrainer(NamedTuple):
    # keys -> train state; the state has scalar fields ``step`` (env steps) and ``updates``.
    init: Callable[[JaxKeys], PyTree]
    # (state, iterations, valid) -> (state, stats), pure; ``iterations`` must be static,
    # ``valid`` may be traced: iterations from ``valid`` on leave the state as it is, so one
    # compiled program runs every chunk of a run, its last one included (``masked_scan``).
    # The stats have fields ``done``, ``episode_return``, ``episode_length`` of shape
    # [iterations, envs]; every stat is per iteration (leading axis) or a scalar.
    run: Callable[[PyTree, int, Valid], tuple[PyTree, PyTree]]
    total_iterations: int
    # Env steps per iteration (num_envs, or num_envs * rollout length).
    steps_per_iteration: int
    # state -> the parameters ``greedy`` needs (not the whole state: it holds the buffers).
    policy_params: Callable[[PyTree], PyTree]
    # (policy params, observations [B, ...]) -> greedy actions [B, ...].
    greedy: Callable[[PyTree, jax.Array], jax.Array]
    # The seeds' chunk stats, as NumPy [seeds, ...] -> the algorithm's metrics (losses/...,
    # charts/...), one value per seed each.
    summarize: Callable[[PyTree], dict[str, np.ndarray]]
    # state -> the pytree saved as the checkpoint.
    checkpoint: Callable[[PyTree], PyTree] = lambda state: state.agent._asdict()
    # (one agent's state, the weights of an agent file) -> that state with its agent's
    # weights (``init_from=``; ``core.state.weights``), its optimizers' states as built.
    start_from: Callable[[PyTree, AgentCheckpoint], PyTree] = lambda state, saved: state._replace(
        agent=with_weights(state.agent, saved)
    )

    def train(self, keys: JaxKeys) -> tuple[PyTree, PyTree]:
        """The whole training as one pure function of the keys (jit/vmap it freely)."""
        return self.run(self.init(keys), self.total_iterations, self.total_iterations)


# A scan's carry, its inputs of one iteration and its outputs of one (jax.lax.scan's names):
# pytrees of the caller's.
Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


def masked_scan(
    iteration: Callable[[Carry, X], tuple[Carry, Y]],
    carry: Carry,
    xs: X,
    length: int,
    valid: Valid,
    unroll: int = 1,
) -> tuple[Carry, Y]:
    """``lax.scan(iteration, carry, xs, length)`` that runs only the first ``valid``
    iterations (``valid`` may be traced; None: all): the outputs of the rest are zeros. A
    run whose length is not a multiple of the chunk can run its last chunk with the same
    compiled program as the others (``FusedTraining`` does so on the CPU).

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

        def kept(carry: Carry, indexed: tuple[jax.Array, X]) -> tuple[Carry, Y]:
            index, x = indexed
            new, out = iteration(carry, x)
            keep = index < valid
            new = jax.tree.map(lambda n, c: jnp.where(keep, n, c), new, carry)
            return new, jax.tree.map(lambda o: jnp.where(keep, o, jnp.zeros_like(o)), out)

        indices = jnp.arange(length)
        scanned: tuple[Carry, Y] = jax.lax.scan(
            kept, carry, (indices, xs), length=length, unroll=unroll
        )
        return scanned

    outs = jax.tree.map(lambda s: jnp.zeros((length, *s.shape), s.dtype), out_shapes)

    def body(index: jax.Array, state: tuple[Carry, Y]) -> tuple[Carry, Y]:
        carry, outs = state
        x = None if xs is None else jax.tree.map(lambda x: x[index], xs)
        # None where ``xs`` is None (a scan without inputs), which is then what X is.
        carry, out = iteration(carry, x)  # type: ignore[arg-type]
        return carry, jax.tree.map(lambda buf, o: buf.at[index].set(o), outs, out)

    looped: tuple[Carry, Y] = jax.lax.fori_loop(0, valid, body, (carry, outs))
    return looped


def scan_iterations(
    iteration: Callable[[Carry, None], tuple[Carry, Y]],
) -> Callable[[Carry, int, Valid], tuple[Carry, Y]]:
    """A ``FusedTrainer.run`` that repeats ``iteration(state, None) -> (state, stats)``."""

    def run(state: Carry, iterations: int, valid: Valid) -> tuple[Carry, Y]:
        return masked_scan(iteration, state, None, iterations, valid)

    return run


def saved_agent_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    init: Callable[[jax.Array], PyTree],
    params_field: str,
    greedy: Callable[[PyTree, jax.Array], jax.Array],
) -> list[Policy]:
    """``saved_policies`` of a checkpoint of the agent NamedTuple ``init`` makes, whose field
    ``params_field`` holds what ``greedy`` takes."""
    template = init(jax.random.key(0))._asdict()
    return saved_policies(cfg, saved, template, lambda agent: agent[params_field], greedy)


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
    cfg: RunConfig,
    saved: AgentCheckpoint,
    template: PyTree,
    params_of: Callable[[PyTree], PyTree],
    greedy: Callable[[PyTree, jax.Array], jax.Array],
) -> list[Policy]:
    """The greedy policies of a saved flax checkpoint (``mode=eval``): one per agent it
    holds (every seed of a fused run, stacked). ``template``: a checkpoint tree of one agent."""
    agents = cfg.num_seeds if is_fused(cfg) else 1
    params = params_of(agents_from_saved(template, saved, agents))
    return list(device_policies(greedy, jax.jit(greedy), params, agents))


def device_policies(
    greedy: Callable[[PyTree, jax.Array], jax.Array],
    compiled: Callable[[PyTree, XpArray], jax.Array],
    params: PyTree,
    agents: int,
) -> list[DevicePolicy]:
    """One ``DevicePolicy`` per agent of ``params`` (stacked on a leading axis where
    ``agents`` > 1), sharing ``compiled``, the jitted ``greedy``."""
    if agents == 1:
        return [DevicePolicy(greedy, compiled, params)]
    return [
        DevicePolicy(greedy, compiled, jax.tree.map(lambda x, i=i: x[i], params))
        for i in range(agents)
    ]


class DevicePolicy:
    """The greedy policy of saved parameters: a host ``Policy`` (NumPy observations in,
    actions out: the host's evaluation, videos) that ``device_score`` can also trace."""

    def __init__(
        self,
        greedy: Callable[[PyTree, jax.Array], jax.Array],
        compiled: Callable[[PyTree, XpArray], jax.Array],
        params: PyTree,
    ):
        self.greedy, self._compiled, self.params = greedy, compiled, params

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._compiled(self.params, obs))


def first_iterations(stats: PyTree, count: int) -> PyTree:
    """The chunk's stats [seeds, iterations, ...] of their first ``count`` iterations."""
    return jax.tree.map(lambda x: x[:, :count] if x.ndim > 1 else x, stats)


def per_seed_sum(values: XpArray) -> np.ndarray:
    """Each seed's sum of a chunk's stat [seeds, ...] (every axis after the first), float64."""
    values = np.asarray(values, dtype=np.float64)
    sums: np.ndarray = values.reshape(len(values), -1).sum(axis=1)
    return sums


def per_seed_mean(values: XpArray) -> np.ndarray:
    """Each seed's mean of a chunk's stat [seeds, ...], float64."""
    values = np.asarray(values, dtype=np.float64)
    means: np.ndarray = values.reshape(len(values), -1).mean(axis=1)
    return means
