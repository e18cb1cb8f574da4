"""``env=jax-vmap``: every copy of the task's functional JAX twin stepped in one jitted
``jax.vmap`` (rlspeed.core.envs.vmap); fused training loops call its functions inside ``jit``.

JAX is imported when the engine is built, not when a config that selects it is checked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlspeed.core.engines import EngineSpec

if TYPE_CHECKING:
    from rlspeed.config import EngineConfig, TaskConfig
    from rlspeed.core.envs.vmap import JaxVmapEngine
    from rlspeed.core.tasks import TaskSpec


def make_engine(
    task: TaskSpec,
    task_cfg: TaskConfig,
    engine_cfg: EngineConfig,
    num_envs: int,
    seed: int,
) -> JaxVmapEngine:
    from rlspeed.core.envs.vmap import JaxVmapEngine, make_vmap_env

    return JaxVmapEngine(make_vmap_env(task, task_cfg, num_envs), seed)


SPEC = EngineSpec(name="jax-vmap", needs_functional_env=True, make=make_engine)
