"""Settings per Gymnasium id: ``task=gym task.id=<id>`` runs with rlspeed's tuned per-pair
defaults for that env where it has them, in place of ``<algo>_gym`` (the algorithm's general
defaults for any id).

The per-pair defaults live in ``conf/algo_task/``. An id that is one of rlspeed's own tasks'
envs takes that task's settings (CartPole-v1 those of ``task=cartpole``, Pendulum-v1 those of
``task=pendulum``); the MuJoCo locomotion ids take those measured on HalfCheetah; DQN and
PPO on MountainCar-v0 and LunarLander-v3, PPO on Acrobot-v1, SAC and TD3 on
MountainCarContinuous-v0 (with correlated exploration) and PPO, SAC and TD3 on
LunarLanderContinuous-v3 take RL Zoo's settings for those ids; PPO on
MountainCarContinuous-v0 takes rlspeed's own (RL Zoo's need gSDE).
What the command line gives still wins over them, as over any default; ``tuned=false`` runs
the id on the algorithm's general defaults, and a command line that chooses ``algo_task``
itself takes that.

Composition cannot choose a config group by a value such as ``task.id`` (Hydra interpolates
group choices only), so a run whose id has settings is composed again with
``algo_task=<name>`` added to its overrides, where a run's config is checked
(``rlspeed.preflight``) and where its job starts (``rlspeed.run.run``, the job's overrides
being Hydra's record of them). A Gymnasium id never runs fused, so never in a batch of
trials (which the Optuna sweeper composes itself).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

# Gymnasium's MuJoCo locomotion and control envs: the family HalfCheetah's settings fit
# (continuous actions, observations of a few dozen entries, 1,000-step episodes).
MUJOCO_IDS = (
    "Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Humanoid-v5", "HumanoidStandup-v5",
    "InvertedDoublePendulum-v5", "InvertedPendulum-v5", "Pusher-v5", "Reacher-v5",
    "Swimmer-v5", "Walker2d-v5",
)  # fmt: skip
# (algorithm, Gymnasium id) -> its per-pair defaults, conf/algo_task/<name>.yaml.
TUNED: dict[tuple[str, str], str] = {
    **{(algo, "CartPole-v1"): f"{algo}_cartpole" for algo in ("dqn", "ppo", "pqn", "vpg")},
    **{(algo, "Pendulum-v1"): f"{algo}_pendulum" for algo in ("ppo", "sac", "td3", "vpg")},
    **{
        (algo, env_id): f"{algo}_halfcheetah"
        for algo in ("ppo", "sac", "td3")
        for env_id in MUJOCO_IDS
    },
    **{(algo, "MountainCar-v0"): f"{algo}_mountaincar" for algo in ("dqn", "ppo")},
    **{(algo, "LunarLander-v3"): f"{algo}_lunarlander" for algo in ("dqn", "ppo")},
    ("ppo", "Acrobot-v1"): "ppo_acrobot",
    **{(algo, "MountainCarContinuous-v0"): f"{algo}_mountaincar" for algo in ("sac", "td3")},
    ("ppo", "MountainCarContinuous-v0"): "ppo_mountaincarcontinuous",
    **{
        (algo, "LunarLanderContinuous-v3"): f"{algo}_lunarlandercontinuous"
        for algo in ("ppo", "sac", "td3")
    },
}  # fmt: skip
GROUP = "algo_task"


def tuned_defaults(composed: DictConfig, overrides: Sequence[str]) -> str | None:
    """The per-pair defaults a run composed from ``overrides`` takes for its Gymnasium id:
    None where its task is not ``gym``, its id has none, ``tuned`` is false or ``overrides``
    choose them."""
    if OmegaConf.select(composed, "task.name") != "gym" or not composed.tuned:
        return None
    env_id = OmegaConf.select(composed, "task.id", throw_on_missing=False)
    if env_id is None or env_id == "???":
        return None
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    if any(override.key_or_group == GROUP for override in parsed):
        return None
    return TUNED.get((str(composed.algo.name), str(env_id)))


def with_tuned_defaults(
    composed: DictConfig, overrides: Sequence[str], compose: Callable[[list[str]], DictConfig]
) -> DictConfig:
    """``composed``, or where its id has tuned per-pair defaults (``tuned_defaults``), the
    config ``compose`` makes of ``overrides`` with them chosen."""
    name = tuned_defaults(composed, overrides)
    return composed if name is None else compose([*overrides, f"{GROUP}={name}"])
