"""rlspeed's core: the RL library (algorithms, networks, rollout and replay pieces, training
loops that yield chunks, environments, engines, backends). It imports nothing of the tool
around it (Hydra, OmegaConf, MLflow, Optuna, rich, TensorBoard, submitit; the command line,
tracking, sweeps): ``tests/test_architecture.py`` fails on such an import.

The aliases below name what the core's annotations pass around where no one library's class
does. They exist for type checkers only (import them under ``TYPE_CHECKING``), so importing
the core loads none of NumPy, JAX or torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

if TYPE_CHECKING:
    import jax
    import numpy as np
    import torch

    # A JAX pytree: arrays in nested tuples, lists, dicts and NamedTuples (a fused train
    # state, an agent's parameters and optimizer states, a chunk's statistics), its structure
    # the algorithm's own. JAX's functions take any such tree, and so do the loops.
    PyTree: TypeAlias = Any
    # A NumPy or a JAX array: what the functions written once for both libraries take, with
    # ``xp`` (``numpy`` or ``jax.numpy``) as the namespace they compute with; also what an
    # engine gives (NumPy from Gymnasium's, JAX from jax-vmap).
    XpArray: TypeAlias = np.ndarray | jax.Array
    # One of the two, the same for every argument of a call that takes several.
    XpArrayT = TypeVar("XpArrayT", np.ndarray, jax.Array)
    # An array of any backend's library: NumPy, JAX or torch. What an engine takes as
    # actions (torch tensors and JAX arrays are read through ``np.asarray`` or DLPack).
    AnyArray: TypeAlias = np.ndarray | jax.Array | torch.Tensor
    # An agent's checkpoint as its learner gives it and its ``load_policies`` takes it back:
    # names to tensors or arrays, or to nested such dicts (torch state dicts, flax params).
    # The run writes it as the agent file and reads it back (``rlspeed.checkpoint``).
    AgentCheckpoint: TypeAlias = dict[str, Any]
