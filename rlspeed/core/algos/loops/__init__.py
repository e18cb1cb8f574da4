"""The training loops, each yielding chunks the run records.

``backend=flax env=jax-vmap`` runs the algorithm's fused program (``fused.py`` says what an
algorithm gives, ``fused_training.py`` runs it): acting, stepping, storing and learning
inside one jitted function, vmapped over seeds. Every other pairing drives the algorithm's
learner from Python, one seed after another (``host.py``). The run (``rlspeed.run``) picks
the loop and does everything around it.
"""

from __future__ import annotations

from typing import NamedTuple

# The agent's file in the run folder, by backend (``mode=eval`` loads it).
CHECKPOINT_FILES = {"torch": "checkpoint.pt", "flax": "checkpoint.msgpack"}


class TrainResult(NamedTuple):
    """What a run's training did: env steps and updates, summed over its agents."""

    steps: int
    updates: int
