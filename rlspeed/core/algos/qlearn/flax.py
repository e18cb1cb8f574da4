"""Tabular Q-learning in JAX (``backend=flax``: the table is a JAX array, no network).

With a Gymnasium engine ``FlaxQTable`` calls jitted ``act`` and ``update`` under
``rlspeed.core.algos.loops.host.HostTraining`` (each iteration is ``QTableLearner.iteration``,
shared with torch's table). With ``env=jax-vmap`` everything is fused: ``make_train`` builds
a pure ``iteration`` (state index, act, env step, table update) that ``lax.scan`` repeats,
driven by ``rlspeed/core/algos/loops/fused.py``, which vmaps it over seeds for ``num_seeds`` > 1.
"""

from __future__ import annotations

import math
from functools import partial, reduce
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np

from rlspeed.core.algos.loops.fused import (
    FusedTrainer,
    masked_scan,
    per_seed_sum,
    saved_policies,
    scan_unroll,
)
from rlspeed.core.algos.qlearn import QTableLearner, table_shape
from rlspeed.core.algos.schedule import epsilon_at
from rlspeed.core.envs.vmap import VmapEnv, VmapState
from rlspeed.core.state import check_shape, tree_from_host, tree_to_host
from rlspeed.core.tasks import Policy
from rlspeed.registry import TASKS
from rlspeed.seeding import JaxKeys, Stream, jax_key

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, XpArray


def max_over_actions(values: jax.Array) -> jax.Array:
    """``values.max(axis=1)`` as elementwise maxima of the action columns: XLA:CPU (jax
    0.10) hands small reductions to YNNPACK, which is ~8x slower on these [envs, actions]
    tables than one fused elementwise loop (measured in the fused gridworld loop)."""
    return reduce(jnp.maximum, [values[:, a] for a in range(values.shape[1])])


def explore_greedy(
    q: jax.Array, states: jax.Array, u: jax.Array, epsilon: float | jax.Array
) -> jax.Array:
    """Epsilon-greedy with random tie-breaking: a uniform pick among all actions with
    probability epsilon, else among the maximal ones. One uniform number per env (``u``)
    does both: below epsilon it explores, and rescaled to [0, 1) within its branch it
    picks which candidate (random numbers are a main cost of the fused loop on CPU)."""
    values = q[states]
    explore = u < epsilon
    candidates = explore[:, None] | (values == max_over_actions(values)[:, None])
    v = jnp.where(explore, u / epsilon, (u - epsilon) / (1.0 - epsilon))
    count = candidates.sum(axis=1)
    pick = jnp.minimum((v * count).astype(jnp.int32), count - 1)
    # The action of the pick-th candidate (0-based), in action order.
    return (jnp.cumsum(candidates, axis=1) <= pick[:, None]).sum(axis=1).astype(jnp.int32)


def step_uniforms(key: jax.Array, step: jax.Array, num_envs: int) -> jax.Array:
    """The uniform numbers ``explore_greedy`` takes at env step ``step``, one per env: a
    function of ``(key, step)`` alone."""
    return jax.random.uniform(jax.random.fold_in(key, step), (num_envs,))


def greedy(q: jax.Array, states: jax.Array) -> jax.Array:
    """Evaluation: the first maximal action (deterministic)."""
    return q[states].argmax(axis=1)


def td_update(
    q: jax.Array,
    states: jax.Array,
    actions: jax.Array,
    rewards: jax.Array,
    next_states: jax.Array,
    terminated: jax.Array,
    alpha: float,
    gamma: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``Q[s, a] += alpha * mean(td)`` over the batch's transitions at each ``(s, a)``;
    returns the new table, the TD errors and ``Q[s, a]`` (both of the table before it)."""
    q_sa = q[states, actions]
    next_value = max_over_actions(q[next_states])
    td = rewards + gamma * (1.0 - terminated.astype(jnp.float32)) * next_value - q_sa
    index = states * q.shape[1] + actions
    # Transitions sharing a cell average their TD errors. One env per agent shares none,
    # and skipping the count runs 30 fused agents ~20% faster (4.7 M -> 5.7 M steps/s).
    hits = jnp.zeros(q.size).at[index].add(1.0)[index] if len(index) > 1 else 1.0
    q = q.reshape(-1).at[index].add(alpha * td / hits).reshape(q.shape)
    return q, td, q_sa


class FlaxQTable(QTableLearner):
    """Jitted act/update for the Python-driven loop (Gymnasium engines)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        super().__init__(cfg)
        algo = cfg.algo
        self.q = jnp.zeros(table_shape(cfg, action_space))
        self.key = jax_key(seed, Stream.ACT)

        # Jitted: step and epsilon arrive as (traced) arrays.
        def act(q: jax.Array, states: jax.Array, step: jax.Array, epsilon: jax.Array) -> jax.Array:
            return explore_greedy(q, states, step_uniforms(self.key, step, len(states)), epsilon)

        step_sizes = partial(td_update, alpha=algo.alpha, gamma=algo.gamma)

        def update(q: jax.Array, *batch: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
            """``td_update`` on a batch (states, actions, rewards, next states, terminated)."""
            q, td, q_sa = step_sizes(q, *batch)
            return q, {"losses/td_error": jnp.abs(td).mean(), "losses/q_values": q_sa.mean()}

        self._act = jax.jit(act)
        self._greedy = jax.jit(greedy)
        self._update = jax.jit(update)

    def act(self, states: np.ndarray, step: int, epsilon: float) -> jax.Array:
        actions: jax.Array = self._act(self.q, states, step, epsilon)
        return actions

    def greedy_states(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(self._greedy(self.q, states))

    def update(
        self,
        states: np.ndarray,
        actions: jax.Array,
        rewards: XpArray,
        next_states: np.ndarray,
        terminated: XpArray,
    ) -> dict[str, jax.Array]:
        metrics: dict[str, jax.Array]
        self.q, metrics = self._update(self.q, states, actions, rewards, next_states, terminated)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the table and the key its exploration draws from."""
        return {"q": tree_to_host(self.q), "key": tree_to_host(self.key)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q = tree_from_host(self.q, state["q"])
        # Read by ``act`` when it is first traced: a resume puts it back before that.
        self.key = tree_from_host(self.key, state["key"])

    def agent_checkpoint(self) -> AgentCheckpoint:
        return {"q_table": self.q}

    def start_from(self, saved: AgentCheckpoint) -> None:
        """``init_from=``: the Q-table of an agent file."""
        self.q = table_from(self.q, saved)


def table_from(q: jax.Array, saved: AgentCheckpoint) -> jax.Array:
    """The Q-table of an agent file (``init_from=``) in place of ``q``; shapes checked."""
    check_shape("q_table", np.shape(saved["q_table"]), q.shape)
    return jnp.asarray(saved["q_table"], dtype=q.dtype)


# ---------------------------------------------------------------- fused jax-vmap path


class TrainState(NamedTuple):
    q: jax.Array
    env: VmapState
    key: jax.Array  # fixed: each step's exploration numbers are step_uniforms(key, step)
    step: jax.Array
    updates: jax.Array


class ChunkStats(NamedTuple):
    """Finished episodes per iteration of a chunk [iters, num_envs]; the update statistics
    as sums over its iterations, one update each (as outputs of every iteration they cost
    the small programs of many agents ~4%), and epsilon at its last iteration."""

    done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    td_error_sum: jax.Array
    q_values_sum: jax.Array
    epsilon: jax.Array


def make_train(cfg: RunConfig, env: VmapEnv) -> FusedTrainer:
    algo, task_cfg, n = cfg.algo, cfg.task, env.num_envs
    tabular = TASKS.get(task_cfg.name).tabular
    unroll = scan_unroll(n * cfg.num_seeds)

    def states_of(obs: jax.Array) -> jax.Array:
        states: jax.Array = tabular.state_index(task_cfg, obs, jnp)
        return states

    def init(keys: JaxKeys) -> TrainState:
        # Q-learning takes Discrete actions only (its SPEC's action kinds: the checks see to it).
        q = jnp.zeros(table_shape(cfg, cast("spaces.Discrete", env.single_action_space)))
        return TrainState(q, env.init(keys.env), keys.act, jnp.int32(0), jnp.int32(0))

    def iteration(
        carry: tuple[TrainState, jax.Array, jax.Array], u: jax.Array
    ) -> tuple[tuple[TrainState, jax.Array, jax.Array], tuple[jax.Array, ...]]:
        state, td_error_sum, q_values_sum = carry
        epsilon = epsilon_at(state.step, algo, cfg.total_steps, xp=jnp)
        states = states_of(state.env.obs)
        actions = explore_greedy(state.q, states, u, epsilon)
        env_state, result = env.step(state.env, actions)
        # The true next state is the final observation where an episode ended.
        q, td, q_sa = td_update(
            state.q,
            states,
            actions,
            result.reward,
            states_of(result.final_obs),
            result.terminated,
            algo.alpha,
            algo.gamma,
        )
        episodes = (
            result.terminated | result.truncated,
            result.episode_return,
            result.episode_length,
        )
        state = TrainState(q, env_state, state.key, state.step + n, state.updates + 1)
        return (state, td_error_sum + jnp.abs(td).mean(), q_values_sum + q_sa.mean()), episodes

    def run(
        state: TrainState, iterations: int, valid: int | jax.Array | None
    ) -> tuple[TrainState, ChunkStats]:
        # XLA:CPU runs threefry as a loop with a cost per call: drawing the chunk's numbers
        # in one call is much faster, and each step's stay the same whatever the chunking.
        steps = state.step + n * jnp.arange(iterations)
        u = jax.vmap(step_uniforms, in_axes=(None, 0, None))(state.key, steps, n)
        zero = jnp.float32(0)
        (end, td_error_sum, q_values_sum), episodes = masked_scan(
            iteration, (state, zero, zero), u, iterations, valid, unroll
        )
        epsilon = epsilon_at(end.step - n, algo, cfg.total_steps, xp=jnp)
        done, episode_return, episode_length = episodes
        return end, ChunkStats(
            done, episode_return, episode_length, td_error_sum, q_values_sum, epsilon
        )

    def summarize(stats: ChunkStats) -> dict[str, np.ndarray]:
        updates = stats.done.shape[1]  # one per iteration
        return {
            "charts/epsilon": per_seed_sum(stats.epsilon),
            "losses/td_error": per_seed_sum(stats.td_error_sum) / updates,
            "losses/q_values": per_seed_sum(stats.q_values_sum) / updates,
        }

    return FusedTrainer(
        init=init,
        run=run,
        total_iterations=math.ceil(cfg.total_steps / n),
        steps_per_iteration=n,
        policy_params=lambda state: state.q,
        greedy=lambda q, obs: greedy(q, states_of(obs)),
        checkpoint=lambda state: {"q_table": state.q},
        start_from=lambda state, saved: state._replace(q=table_from(state.q, saved)),
        summarize=summarize,
    )


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Discrete,
) -> list[Policy]:
    """The greedy policies of a saved ``checkpoint.msgpack`` (``mode=eval``)."""
    tabular = TASKS.get(cfg.task.name).tabular
    template = {"q_table": jnp.zeros(table_shape(cfg, action_space))}
    return saved_policies(
        cfg,
        saved,
        template,
        lambda saved: saved["q_table"],
        lambda q, obs: greedy(q, tabular.state_index(cfg.task, obs, jnp)),
    )
