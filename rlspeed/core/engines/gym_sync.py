"""``env=gym-sync``: gymnasium.vector.SyncVectorEnv, all copies stepped in this process."""

from functools import partial

from rlspeed.core.engines import EngineSpec
from rlspeed.core.engines.gym_vector import make_vector_engine

SPEC = EngineSpec(
    name="gym-sync",
    needs_functional_env=False,
    make=partial(make_vector_engine, asynchronous=False),
)
