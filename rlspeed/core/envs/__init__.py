"""Environment registrations for rlspeed."""

import gymnasium


def _register(env_id: str, entry_point: str, max_episode_steps: int) -> None:
    # Guard so that re-importing (e.g. after importlib.reload) does not warn about
    # overriding an existing registration.
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=entry_point, max_episode_steps=max_episode_steps)


_register("rlspeed/Doors-v0", "rlspeed.core.envs.doors:DoorsEnv", 32)
_register("rlspeed/GridWorld-v0", "rlspeed.core.envs.gridworld:GridWorldEnv", 50)
_register("rlspeed/Probe-v0", "rlspeed.core.envs.probe:ProbeEnv", 4)
