"""Environment registrations for rlspeed."""

import gymnasium

# Guard so that re-importing (e.g. after importlib.reload) does not warn about
# overriding an existing registration.
if "rlspeed/Doors-v0" not in gymnasium.registry:
    gymnasium.register(
        id="rlspeed/Doors-v0",
        entry_point="rlspeed.envs.doors:DoorsEnv",
        max_episode_steps=32,
    )
