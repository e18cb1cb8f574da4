"""``env=gym-async``: gymnasium.vector.AsyncVectorEnv, one subprocess per copy, shared memory."""

from functools import partial

from rlspeed.engines import EngineSpec
from rlspeed.engines.gym_vector import make_vector_engine

SPEC = EngineSpec(
    name="gym-async",
    needs_functional_env=False,
    make=partial(make_vector_engine, asynchronous=True),
)
