"""The fair PyTorch baseline: DQN as a single-file CleanRL-style script.

Everything in one loop, top to bottom: Gymnasium's SyncVectorEnv, a NumPy replay buffer,
a torch Q-network, a linear epsilon schedule, no framework. The ``table2`` and
``cartpole`` benchmarks run it with the exact hyperparameters of rlspeed's torch +
gym-sync run, so rlspeed's own PyTorch path is measured against a plain script and not
only against itself. Step counts are env steps, as in rlspeed: one gradient update per
``train_frequency`` env steps after ``learning_starts``, whatever ``num_envs`` is.

    python -m rlspeed.bench.cleanrl_dqn --env-id CartPole-v1 --total-steps 100000

The last line printed is a JSON object with the run's env steps, updates and timings.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from dataclasses import dataclass, field, fields

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium.vector import AutoresetMode
from torch import nn


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    seed: int = 1
    num_envs: int = 8
    total_steps: int = 500_000
    learning_rate: float = 2.5e-4
    anneal_lr: bool = False
    buffer_size: int = 50_000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 1_000
    batch_size: int = 128
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.3
    learning_starts: int = 5_000
    train_frequency: int = 4
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 128])


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Args()
    for f in fields(Args):
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, list):
            parser.add_argument(flag, type=int, nargs="+", default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return Args(**vars(parser.parse_args()))


class QNetwork(nn.Module):
    def __init__(self, envs: gym.vector.VectorEnv, hidden_sizes: list[int]) -> None:
        super().__init__()
        space, action_space = envs.single_observation_space, envs.single_action_space
        assert space.shape is not None, "an observation space with a shape"
        assert isinstance(action_space, gym.spaces.Discrete), "DQN: discrete actions only"
        # Integer observations (Doors' cell codes) enter one-hot, as in rlspeed.
        self.classes = int(space.nvec.max()) if isinstance(space, gym.spaces.MultiDiscrete) else 0
        sizes = [int(np.prod(space.shape)) * (self.classes or 1), *hidden_sizes]
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], int(action_space.n)))
        self.network = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.classes:
            return self.network(F.one_hot(obs.long(), self.classes).flatten(1).float())
        return self.network(obs.flatten(1).float())


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    return start_e + (end_e - start_e) * min(t / max(duration, 1.0), 1.0)


def multiples_crossed(prev: int, step: int, every: int, start: int) -> int:
    """Multiples of ``every`` in ``(max(prev, start), step]``: events due in this vector step."""
    return max(step // every - max(prev, start) // every, 0)


def main(args: Args) -> dict[str, float]:
    import rlspeed.core.envs  # noqa: F401  (registers rlspeed/Doors-v0 and rlspeed/GridWorld-v0)

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    start_time = time.perf_counter()

    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(args.env_id) for _ in range(args.num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    q_network = QNetwork(envs, args.hidden_sizes)
    target_network = QNetwork(envs, args.hidden_sizes)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    # The loop takes whole vector steps: it runs to total_steps rounded up to num_envs.
    last_step = -(-args.total_steps // args.num_envs) * args.num_envs
    total_updates = multiples_crossed(0, last_step, args.train_frequency, args.learning_starts)
    action_space, obs_shape = envs.single_action_space, envs.single_observation_space.shape
    assert isinstance(action_space, gym.spaces.Discrete), "DQN: discrete actions only"
    assert obs_shape is not None, "an observation space with a shape"
    n_actions = int(action_space.n)

    buffer_obs = np.zeros((args.buffer_size, *obs_shape), envs.single_observation_space.dtype)
    buffer_next_obs = np.zeros_like(buffer_obs)
    buffer_actions = np.zeros(args.buffer_size, np.int64)
    buffer_rewards = np.zeros(args.buffer_size, np.float32)
    buffer_dones = np.zeros(args.buffer_size, np.float32)
    position = size = 0

    episode_returns = np.zeros(args.num_envs)
    recent_returns: deque[float] = deque(maxlen=20)
    step = updates = 0
    obs, _ = envs.reset(seed=args.seed)
    while step < args.total_steps:
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_steps, step
        )
        # Each env explores on its own coin flip.
        with torch.no_grad():
            greedy = q_network(torch.from_numpy(obs)).argmax(dim=1).numpy()
        explore = rng.random(args.num_envs) < epsilon
        actions = np.where(explore, rng.integers(n_actions, size=args.num_envs), greedy)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        # With same-step autoreset, next_obs of a finished env is the new episode's first
        # observation; the transition must store the final one.
        real_next_obs = next_obs.copy()
        for i in np.flatnonzero(infos.get("_final_obs", ())):
            real_next_obs[i] = infos["final_obs"][i]
        index = (position + np.arange(args.num_envs)) % args.buffer_size
        buffer_obs[index], buffer_next_obs[index] = obs, real_next_obs
        buffer_actions[index], buffer_rewards[index] = actions, rewards
        buffer_dones[index] = terminations
        position = (position + args.num_envs) % args.buffer_size
        size = min(size + args.num_envs, args.buffer_size)

        episode_returns += rewards
        for i in np.flatnonzero(terminations | truncations):
            recent_returns.append(float(episode_returns[i]))
            episode_returns[i] = 0.0
        obs = next_obs
        prev, step = step, step + args.num_envs

        for _ in range(multiples_crossed(prev, step, args.train_frequency, args.learning_starts)):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (
                    1.0 - updates / max(total_updates, 1)
                )
            sample = rng.integers(0, size, args.batch_size)
            with torch.no_grad():
                next_q = target_network(torch.from_numpy(buffer_next_obs[sample])).max(dim=1)[0]
                td_target = torch.from_numpy(buffer_rewards[sample]) + args.gamma * next_q * (
                    1.0 - torch.from_numpy(buffer_dones[sample])
                )
            q = q_network(torch.from_numpy(buffer_obs[sample]))
            q = q.gather(1, torch.from_numpy(buffer_actions[sample]).unsqueeze(1)).squeeze(1)
            loss = F.mse_loss(q, td_target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1

        syncs = multiples_crossed(prev, step, args.target_network_frequency, args.learning_starts)
        if syncs:
            # Several sync points crossed in one vector step: that many Polyak steps at once.
            weight = 1.0 - (1.0 - args.tau) ** syncs
            with torch.no_grad():
                for target, online in zip(
                    target_network.parameters(), q_network.parameters(), strict=True
                ):
                    target.lerp_(online, weight)

    envs.close()
    wall_time = time.perf_counter() - start_time
    return {
        "env_steps": step,
        "gradient_updates": updates,
        "wall_time_s": wall_time,
        "env_steps_per_s": step / wall_time,
        "updates_per_s": updates / wall_time,
        "recent_return": float(np.mean(recent_returns)) if recent_returns else float("nan"),
    }


if __name__ == "__main__":
    print(json.dumps(main(parse_args())))
