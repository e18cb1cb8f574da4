"""A Gymnasium id rlspeed has tuned settings for runs with them (``rlspeed.gym_ids``): the
settings of rlspeed's own task for the same env, or of its family, under what the command
line gives; ``tuned=false`` leaves the algorithm's general defaults."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli

SHORT = ["total_steps=256", "eval_every=256", "algo.learning_starts=64", "progress=plain"]


def _job(args: list[str], tmp_path) -> dict:
    """The config the command line's check composes for ``args`` (what ``--cfg job``
    prints), in this process."""
    from omegaconf import OmegaConf

    from rlspeed.cli import CONF_DIR, set_up_config_tree
    from rlspeed.preflight import check_overrides

    set_up_config_tree()
    composed = check_overrides(args, [], CONF_DIR).composed
    return OmegaConf.to_container(composed, resolve=True)


def test_an_id_with_tuned_settings_takes_its_own_tasks_under_the_command_line(tmp_path):
    own = _job(["task=pendulum", "algo=td3"], tmp_path)
    tuned = _job(["task=gym", "task.id=Pendulum-v1", "algo=td3", "algo.tau=0.01"], tmp_path)
    general = _job(["task=gym", "task.id=Pendulum-v1", "algo=td3", "tuned=false"], tmp_path)
    assert tuned["algo"] == {**own["algo"], "tau": 0.01}
    assert (tuned["total_steps"], tuned["num_envs"]) == (own["total_steps"], own["num_envs"])
    assert own["algo"]["learning_rate"] != general["algo"]["learning_rate"]  # td3's own 3e-4
    assert general["total_steps"] == 300_000 and general["algo"]["tau"] == 0.005


def test_mountain_car_takes_rl_zoos_dqn_and_ppo_settings(tmp_path):
    """DQN and PPO on MountainCar-v0: the settings RL Zoo publishes for the id
    (conf/algo_task/{dqn,ppo}_mountaincar.yaml), not the algorithms' general ones."""
    mountain = _job(["task=gym", "task.id=MountainCar-v0", "algo=dqn"], tmp_path)
    general = _job(["task=gym", "task.id=MountainCar-v0", "algo=dqn", "tuned=false"], tmp_path)
    assert mountain["algo"]["gamma"] == 0.98 and mountain["algo"]["train_frequency"] == 2
    assert mountain["algo"]["learning_rate"] == 0.004 and mountain["total_steps"] == 120_000
    assert general["algo"]["learning_rate"] == 0.0003 and general["algo"]["gamma"] == 0.99
    ppo = _job(["task=gym", "task.id=MountainCar-v0", "algo=ppo"], tmp_path)
    assert (ppo["num_envs"], ppo["algo"]["num_steps"], ppo["algo"]["gae_lambda"]) == (16, 16, 0.98)
    assert ppo["algo"]["normalize_obs"] is True and ppo["algo"]["scale_rewards"] is True
    general = _job(["task=gym", "task.id=MountainCar-v0", "algo=ppo", "tuned=false"], tmp_path)
    assert general["algo"]["normalize_obs"] is False and general["algo"]["num_steps"] == 128


def test_acrobot_takes_rl_zoos_ppo_settings(tmp_path):
    """PPO on Acrobot-v1: RL Zoo's settings for the id (conf/algo_task/ppo_acrobot.yaml)."""
    ppo = _job(["task=gym", "task.id=Acrobot-v1", "algo=ppo"], tmp_path)
    assert (ppo["num_envs"], ppo["algo"]["num_steps"], ppo["algo"]["gae_lambda"]) == (16, 256, 0.94)
    assert ppo["algo"]["normalize_obs"] is True and ppo["algo"]["num_minibatches"] == 64
    general = _job(["task=gym", "task.id=Acrobot-v1", "algo=ppo", "tuned=false"], tmp_path)
    assert general["algo"]["normalize_obs"] is False and general["algo"]["gae_lambda"] == 0.95


def test_continuous_ids_take_rl_zoos_settings(tmp_path):
    """TD3 and SAC on MountainCarContinuous-v0 explore with OU noise (Gaussian noise never
    finds the flag), PPO takes rlspeed's measured settings; PPO, SAC and TD3 on
    LunarLanderContinuous-v3 take RL Zoo's settings."""
    mountain = ["task=gym", "task.id=MountainCarContinuous-v0", "algo=td3"]
    td3 = _job(mountain, tmp_path)
    assert (td3["algo"]["exploration"], td3["algo"]["exploration_noise"]) == ("ou", 0.5)
    assert td3["algo"]["ou_dt"] == 0.1 and td3["num_envs"] == 1
    assert _job([*mountain, "tuned=false"], tmp_path)["algo"]["exploration"] == "gaussian"
    sac = _job([*mountain[:2], "algo=sac"], tmp_path)
    assert (sac["algo"]["exploration"], sac["algo"]["ou_theta"] * sac["algo"]["ou_dt"]) == (
        "ou",
        0.1,
    )
    assert (sac["algo"]["autotune"], sac["algo"]["alpha"], sac["num_envs"]) == (False, 0.1, 1)
    ppo = _job([*mountain[:2], "algo=ppo"], tmp_path)
    assert (ppo["algo"]["gamma"], ppo["algo"]["initial_log_std"], ppo["num_envs"]) == (
        0.9999,
        0.5,
        16,
    )
    lander = ["task=gym", "task.id=LunarLanderContinuous-v3"]
    td3 = _job([*lander, "algo=td3"], tmp_path)
    assert (td3["algo"]["gamma"], td3["algo"]["buffer_size"]) == (0.98, 200_000)
    sac = _job([*lander, "algo=sac"], tmp_path)
    assert (sac["algo"]["q_lr"], sac["algo"]["tau"]) == (0.00073, 0.01)
    ppo = _job([*lander, "algo=ppo"], tmp_path)
    discrete = _job(["task=gym", "task.id=LunarLander-v3", "algo=ppo"], tmp_path)
    assert ppo["algo"] == discrete["algo"] and ppo["total_steps"] == discrete["total_steps"]


def test_lunar_lander_takes_rl_zoos_dqn_and_ppo_settings(tmp_path):
    """DQN and PPO on LunarLander-v3 (Box2D, installed with rlspeed): RL Zoo's settings for
    the id (conf/algo_task/{dqn,ppo}_lunarlander.yaml); what the command line gives wins."""
    dqn = _job(["task=gym", "task.id=LunarLander-v3", "algo=dqn", "algo.batch_size=64"], tmp_path)
    assert dqn["algo"]["learning_rate"] == 0.00063 and dqn["algo"]["train_frequency"] == 1
    assert dqn["algo"]["batch_size"] == 64 and dqn["algo"]["target_network_frequency"] == 250
    ppo = _job(["task=gym", "task.id=LunarLander-v3", "algo=ppo"], tmp_path)
    assert (ppo["num_envs"], ppo["algo"]["num_steps"], ppo["algo"]["num_minibatches"]) == (
        16,
        1024,
        256,
    )
    assert ppo["algo"]["gamma"] == 0.999 and ppo["algo"]["anneal_lr"] is False
    general = _job(["task=gym", "task.id=LunarLander-v3", "algo=ppo", "tuned=false"], tmp_path)
    assert general["algo"]["gamma"] == 0.99 and general["algo"]["num_steps"] == 128


def test_a_mujoco_id_takes_the_family_settings_and_may_normalise_observations(tmp_path):
    """PPO on Hopper-v5: the continuous-control settings measured on HalfCheetah (its
    observation normalisation was refused on any Gymnasium id before: task=gym could be
    tabular)."""
    hopper = _job(["task=gym", "task.id=Hopper-v5", "algo=ppo"], tmp_path)
    cheetah = _job(["task=halfcheetah", "algo=ppo", "env=gym-sync"], tmp_path)
    assert hopper["algo"] == cheetah["algo"] and hopper["algo"]["normalize_obs"] is True
    from rlspeed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"algo.normalize_obs=True: .*categorical"):
        _job(["task=gym", "task.id=FrozenLake-v1", "algo=ppo", "algo.normalize_obs=true"], tmp_path)


@pytest.mark.slow  # 9-20 s on 2 cores: the default selection stays under 5 minutes
def test_each_job_of_a_grid_takes_its_ids_settings_and_records_them(tmp_path):
    """A grid over ids: the job on CartPole-v1 runs with task=cartpole's DQN settings (step
    size 2.5e-4, a target copy every 500 updates), the one on CartPole-v0, which has none,
    with DQN's settings for any id (3e-4), each config.yaml saying so."""
    sweep = tmp_path / "sweep"
    args = ["-m", "task=gym", "task.id=CartPole-v1,CartPole-v0", "algo=dqn", "tracking=none"]
    result = run_cli([*args, *SHORT, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    saved = {}
    for folder in sorted(p for p in sweep.iterdir() if (p / "config.yaml").exists()):
        config = yaml.safe_load((folder / "config.yaml").read_text())
        saved[config["task"]["id"]] = config
        assert json.loads((folder / "metrics.json").read_text())["status"] == "FINISHED"
    assert saved["CartPole-v1"]["algo"]["learning_rate"] == 0.00025
    assert saved["CartPole-v1"]["algo"]["target_network_frequency"] == 500
    assert saved["CartPole-v0"]["algo"]["learning_rate"] == 0.0003
    assert saved["CartPole-v1"]["algo"]["learning_starts"] == 64  # the command line's
    assert "takes rlspeed's settings for that env (conf/algo_task/dqn_cartpole.yaml" in (
        result.stdout + result.stderr
    )
