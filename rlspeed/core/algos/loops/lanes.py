"""A fused program's lanes (a run's seeds, a batch's trials) spread over devices.

The lanes are independent, so each device runs the same vmapped program on its own share
of them (``jax.shard_map`` over a one-axis ``Mesh``, inside the one ``jax.jit``) and no
device waits on another: there is no collective. Lanes are padded to a whole number per
device; padded lanes copy lane 0's inputs, are frozen from the start and never read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

if TYPE_CHECKING:
    from rlspeed.core import PyTree

# The mesh's one axis: the lanes. An argument is split along its lane axis, a share per
# device (SPLIT), or whole on every device (WHOLE).
LANES = "lanes"
SPLIT = PartitionSpec(LANES)  # type: ignore[no-untyped-call]  # jax leaves it unannotated
WHOLE = PartitionSpec()  # type: ignore[no-untyped-call]

Program = TypeVar("Program", bound=Callable[..., object])
Value = TypeVar("Value")


class LaneLayout:
    """``lanes`` lanes on ``devices``: as few of them as hold the fewest lanes per device
    (5 lanes on 4 devices: 2 each on 3, not 2, 1, 1, 1 padded to 8), each holding
    ``per_device``; ``padded`` lanes in all, the real ones first."""

    def __init__(self, lanes: int, devices: Sequence[jax.Device]) -> None:
        assert lanes >= 1 and devices, "a layout has lanes and devices"
        self.lanes = lanes
        self.per_device = math.ceil(lanes / len(devices))
        self.devices = list(devices[: math.ceil(lanes / self.per_device)])
        self.padded = self.per_device * len(self.devices)
        self.sharded = len(self.devices) > 1
        if self.sharded:
            # XLA's Shardy partitioner cannot take the mulhi of the envs' Philox stream
            # (``vmap.ENV_PRNG``): "Unable to convert MHLO to StableHLO" (jax 0.10.2, CPU
            # and GPU alike). GSPMD partitions the same program, and says on stderr, once
            # per compiled program, that it will be deprecated.
            jax.config.update("jax_use_shardy_partitioner", False)  # type: ignore[no-untyped-call]
        mesh = Mesh(np.array(self.devices), (LANES,))
        self._mesh = mesh
        # Every array with a lane axis: split along it, a share per device.
        self.sharding = NamedSharding(mesh, SPLIT)

    @property
    def names(self) -> list[str]:
        """The devices the lanes run on, as ``platform:id`` (``cuda:0``, ``cpu:1``)."""
        return [f"{device.platform}:{device.id}" for device in self.devices]

    def spread(self, program: Program, lane_args: Sequence[bool]) -> Program:
        """``program`` (vmapped over lanes) run by every device on its share of the lanes:
        the arguments where ``lane_args`` is True are split along their lane axis, the
        others are whole on every device; every output has a lane axis. As it is where
        the lanes are on one device."""
        if not self.sharded:
            return program
        specs = tuple(SPLIT if lane else WHOLE for lane in lane_args)
        # No collective to check (check_vma): a lane reads nothing of another's.
        spread: Program = jax.shard_map(
            program,
            mesh=self._mesh,
            in_specs=specs,
            out_specs=SPLIT,
            check_vma=False,
        )
        return spread

    def place(self, tree: PyTree) -> PyTree:
        """``tree`` (its arrays with a lane axis of ``padded``) where the program keeps it."""
        return jax.device_put(tree, self.sharding) if self.sharded else tree

    def pad(self, tree: PyTree) -> PyTree:
        """``tree``'s arrays with their lane axis padded from ``lanes`` to ``padded`` by
        copies of lane 0 (NumPy stays NumPy)."""
        extra = self.padded - self.lanes
        if extra == 0:
            return tree

        def padded(x: np.ndarray | jax.Array) -> np.ndarray | jax.Array:
            if isinstance(x, np.ndarray):
                return np.concatenate([x, np.repeat(x[:1], extra, axis=0)])
            return jnp.concatenate([x, jnp.repeat(x[:1], extra, axis=0)])

        return jax.tree.map(padded, tree)

    def real(self, tree: PyTree) -> PyTree:
        """``tree`` without its padded lanes."""
        if self.padded == self.lanes:
            return tree
        return jax.tree.map(lambda x: x[: self.lanes], tree)

    def padded_list(self, values: list[Value]) -> list[Value]:
        """``values`` (one per lane) with lane 0's for each padded lane."""
        return values + values[:1] * (self.padded - self.lanes)
