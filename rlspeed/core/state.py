"""What the parts of a training keep, as trees of arrays: their resume state and their
agents' checkpoints, and how those trees go back into live parts. No file is read or written
here: the run (``rlspeed.recording``, ``rlspeed.checkpoint``) does that with these trees.

Every part a training loop carries over a resume (a learner, its replay buffer, the interval
metrics, the engine) says what its state is: ``state_dict()`` returns it as a tree the resume
file can hold (``rlspeed.statefile``), ``load_state_dict(state)`` puts such a tree back into
a part built from the same config. The helpers below turn what the parts hold (NumPy
generators and arrays, torch tensors, JAX pytrees) into such trees and back, so that the
parts' own methods only name what they hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import numpy as np

from rlspeed.errors import RLSpeedError

if TYPE_CHECKING:
    import jax
    import torch

    from rlspeed.core import AgentCheckpoint, PyTree


class Stateful(Protocol):
    """A part whose state a resume file holds (see above)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def capture(part: object) -> dict[str, Any]:
    """The state of ``part`` (a learner, a replay buffer, an engine, ...) as the resume file
    holds it: what its ``state_dict()`` says."""
    return _stateful(part).state_dict()


def restore(part: object, state: dict[str, Any]) -> None:
    """Put a ``capture`` of a part of the same kind back into ``part``: its
    ``load_state_dict``. A saved array of another shape than the part's is a ValueError
    (``check_shape``), a missing entry a KeyError."""
    _stateful(part).load_state_dict(state)


def _stateful(part: object) -> Stateful:
    if callable(getattr(part, "state_dict", None)) and callable(
        getattr(part, "load_state_dict", None)
    ):
        return cast(Stateful, part)  # it has both methods (checked just above)
    name = type(part).__name__
    raise RLSpeedError(
        f"rlspeed: {name} has no state_dict()/load_state_dict(), so its state cannot be saved "
        f"for resume=; a part a training loop carries says what its state is with both "
        f"(rlspeed.core.state)"
    )


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """A NumPy generator's state (its bit generator's: a dict of ints)."""
    return dict(rng.bit_generator.state)


def load_rng_state(rng: np.random.Generator, saved: dict[str, Any]) -> None:
    rng.bit_generator.state = saved


def load_array(name: str, array: np.ndarray | torch.Tensor, saved: np.ndarray) -> None:
    """Copy the saved array into ``array`` (NumPy, or a torch tensor: in place, on its device),
    refusing one of another shape (NumPy and torch would broadcast some)."""
    check_shape(name, np.shape(saved), tuple(array.shape))
    if isinstance(array, np.ndarray):
        array[...] = saved
        return
    import torch  # loaded already: the array is one of its tensors

    with torch.no_grad():
        array.copy_(torch.as_tensor(saved))


@runtime_checkable
class Partly(Protocol):
    """A pytree node whose arrays are written from the start up to a point (a replay
    buffer): a resume file keeps that part of them, ``tree_from_host`` puts it back."""

    def written(self, num_envs: int) -> Partly: ...


def written_parts(tree: PyTree, num_envs: int) -> PyTree:
    """``tree`` with each ``Partly`` node cut to what is written of it."""
    import jax

    def part(node: Any) -> Any:
        return node.written(num_envs) if isinstance(node, Partly) else node

    return jax.tree.map(part, tree, is_leaf=lambda node: isinstance(node, Partly))


def tree_to_host(tree: PyTree) -> list[np.ndarray]:
    """A JAX pytree's leaves as NumPy arrays (typed PRNG keys as their key data)."""
    import jax
    import jax.numpy as jnp

    def host(leaf: jax.Array) -> np.ndarray:
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        return np.asarray(jax.device_get(leaf))

    return [host(leaf) for leaf in jax.tree.leaves(tree)]


def tree_from_host(template: PyTree, leaves: list[np.ndarray]) -> PyTree:
    """``template``'s pytree with the saved ``leaves`` (from ``tree_to_host``) in it. An
    array of a ``Partly`` node may be saved as far as it was written (``written_parts``);
    any other must have the template's shape."""
    import jax
    import jax.numpy as jnp

    old, treedef = jax.tree.flatten(template)
    if len(old) != len(leaves):
        raise ValueError(f"the saved state has {len(leaves)} arrays, this run's {len(old)}")

    def marks(node: Any) -> Any:
        return jax.tree.map(lambda _: True, node) if isinstance(node, Partly) else False

    partly = jax.tree.leaves(
        jax.tree.map(marks, template, is_leaf=lambda node: isinstance(node, Partly))
    )

    def device(like: jax.Array, saved: np.ndarray, part: bool) -> jax.Array:
        if jnp.issubdtype(like.dtype, jax.dtypes.prng_key):
            key: jax.Array = jax.random.wrap_key_data(
                jnp.asarray(saved), impl=jax.random.key_impl(like)
            )
            return key
        if saved.shape != like.shape and part:
            return _written_into(like, saved)
        if saved.shape != like.shape:
            raise ValueError(f"a saved array has shape {saved.shape}, this run's {like.shape}")
        return jnp.asarray(saved, dtype=like.dtype)

    restored = [device(*args) for args in zip(old, leaves, partly, strict=True)]
    return jax.tree.unflatten(treedef, restored)


def _written_into(like: jax.Array, saved: np.ndarray) -> jax.Array:
    """A ``Partly`` node's saved array (``written_parts``), shorter along one axis than
    the fresh one, ``like``: the saved part, then ``like``'s own (an empty buffer's)."""
    import jax.numpy as jnp

    differ = [i for i, (a, b) in enumerate(zip(saved.shape, like.shape, strict=False)) if a != b]
    if (
        saved.ndim != like.ndim
        or len(differ) != 1
        or saved.shape[differ[0]] > like.shape[differ[0]]
    ):
        raise ValueError(f"a saved array has shape {saved.shape}, this run's {like.shape}")
    part = (slice(None),) * differ[0] + (slice(0, saved.shape[differ[0]]),)
    return like.at[part].set(jnp.asarray(saved, dtype=like.dtype))


def agents_from_saved(template: PyTree, saved: AgentCheckpoint, agents: int = 1) -> PyTree:
    """A flax agent file's tree (``flax.serialization.msgpack_restore`` of it) in
    ``template``'s structure: one agent's, or with ``agents`` > 1 a fused run's, each array
    stacked over its agents on a new leading axis. A saved array of another shape than the
    template's is a ValueError (``check_shape``)."""
    import flax.serialization
    import jax
    import jax.numpy as jnp

    if agents > 1:
        template = jax.tree.map(lambda x: jnp.stack([x] * agents), template)
    restored = flax.serialization.from_state_dict(template, saved)
    # from_state_dict takes each array's shape from the saved tree, whatever the template's.
    for (where, want), got in zip(
        jax.tree_util.tree_leaves_with_path(template), jax.tree.leaves(restored), strict=True
    ):
        name = jax.tree_util.keystr(where, simple=True, separator="/")
        check_shape(name, np.shape(got), np.shape(want))
    return restored


# How an agent file names its optimizers' states: torch's ``optimizer`` (``policy_optimizer``),
# flax's ``opt_state`` (``actor_opt_state``). The rest are the agent's weights.
OPTIMIZER_ENTRIES = ("optimizer", "opt_state")


def weights(saved: AgentCheckpoint) -> AgentCheckpoint:
    """An agent file's tree without its optimizers' states: what ``init_from=`` starts a
    new run's agent from (networks, target networks, a Q-table, SAC's entropy coefficient).
    Integer arrays in it are counters (PQN's exploration clock), which the new run's agent
    keeps at its own (``load_weights``, ``with_weights``)."""
    return {name: part for name, part in saved.items() if not name.endswith(OPTIMIZER_ENTRIES)}


def load_weights(live: AgentCheckpoint, saved: AgentCheckpoint) -> None:
    """Copy ``saved`` (``weights`` of an agent file) into ``live``, a torch learner's
    ``agent_checkpoint()``: its modules' ``state_dict()`` entries are references to their
    parameters and buffers, so the copy lands in the networks (``load_array``: in place,
    shapes checked)."""

    def copy(name: str, into: Any, tree: Any) -> None:
        if isinstance(into, dict):
            if set(into) != set(tree):
                raise ValueError(f"{name} holds {sorted(tree)}, this run's {sorted(into)}")
            for key, part in into.items():
                copy(f"{name}/{key}", part, tree[key])
        elif into.is_floating_point():
            load_array(name, into, tree)

    for name, tree in saved.items():
        copy(name, live[name], tree)


def with_weights(agent: Any, saved: AgentCheckpoint) -> Any:
    """A flax agent (a NamedTuple of parameters and optimizer states) with ``saved``
    (``weights`` of an agent file of one agent) in place of its fields of those names;
    shapes checked."""
    import jax
    import jax.numpy as jnp

    def take(own: jax.Array, restored: Any) -> jax.Array:
        if jnp.issubdtype(own.dtype, jnp.integer):
            return own
        taken: jax.Array = jnp.asarray(restored, dtype=own.dtype)
        return taken

    fields = {}
    for name, part in saved.items():
        own = getattr(agent, name)
        fields[name] = jax.tree.map(take, own, agents_from_saved(own, part))
    return agent._replace(**fields)


def check_shape(name: str, saved: tuple[int, ...], built: tuple[int, ...]) -> None:
    """Raise ValueError if a saved array's shape is not the one its run's config builds
    (an agent file of a run with another grid size, hidden sizes, ... in the folder)."""
    if tuple(saved) != tuple(built):
        raise ValueError(
            f"the shapes differ: {name} has shape {tuple(saved)} in the file, its config.yaml "
            f"makes {tuple(built)}"
        )
