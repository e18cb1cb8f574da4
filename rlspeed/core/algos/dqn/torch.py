"""DQN in PyTorch, on any engine (Gymnasium or JAX through DLPack).

``TorchLearner`` runs under ``rlspeed.core.algos.loops.host.HostTraining``: each iteration
(``ReplayLearner.iteration``, shared with TD3) collects with ``act`` into the replay buffer,
then learns with ``update`` (TD targets from the target network, the loss, the step) as
often as due, then syncs the target network as due (``DQNSchedule.after_env_steps``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.dlpack import from_dlpack

from rlspeed.core.algos.dqn import DQNConfig, DQNSchedule, learning_rate_at
from rlspeed.core.algos.encoding import through_torso
from rlspeed.core.algos.networks.torch import (
    MLP,
    device_of_module,
    from_numpy,
    optimizer,
)
from rlspeed.core.algos.replay import Batch, ReplayLearner, replay_buffer
from rlspeed.core.backends.torch import device_of
from rlspeed.core.tasks import Policy
from rlspeed.seeding import Stream, int_seed

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, AnyArray


def q_network(obs_space: spaces.Space[Any], action_space: spaces.Discrete, algo: DQNConfig) -> MLP:
    """Observations (through the conv torso where they are images) -> Q-value of every
    action: hidden layers with ReLU."""
    torso = through_torso(obs_space, algo.network)
    return MLP(obs_space, int(action_space.n), algo.hidden_sizes, nn.ReLU, torso=torso)


@torch.no_grad()
def greedy_actions(q_network: nn.Module, obs: np.ndarray) -> np.ndarray:
    q: torch.Tensor = q_network(from_numpy(obs, device_of_module(q_network)))
    return q.argmax(dim=1).cpu().numpy()


class EpsilonGreedy:
    """DQN's and PQN's exploration for ``n`` envs: each env's action the greedy one or, with
    probability epsilon, a uniformly random one of ``n_actions``, as int32 (what the JAX
    engine takes with x64 disabled). Drawn on the CPU ``generator``: the same exploration on
    every device.

    Each call draws 2n uniforms into one buffer it keeps (a run of one env acts once per env
    step: a fresh ``torch.rand`` with a generator cost three times the in-place draw, and
    each further torch call as much again), then chooses in NumPy on views of it."""

    def __init__(self, n: int, n_actions: int, generator: torch.Generator) -> None:
        self.n_actions, self.generator = n_actions, generator
        self._draws = torch.empty(2, n, dtype=torch.float64)
        self._explore_draw, self._action_draw = self._draws.numpy()

    def __call__(self, greedy: Callable[[], torch.Tensor], epsilon: float) -> np.ndarray:
        """The actions, ``greedy()`` giving the greedy ones (on the CPU) where some env does
        not explore: its forward pass is skipped where every env explores (as CleanRL's
        dqn.py skips it), the same actions at a fraction of the cost early in a run."""
        self._draws.uniform_(generator=self.generator)
        explore = self._explore_draw < epsilon
        # floor(u * n_actions) of a u in [0, 1): each action with probability 1 / n_actions.
        random: np.ndarray = (self._action_draw * self.n_actions).astype(np.int32)
        if explore.all():
            return random
        chosen: np.ndarray = np.where(explore, random, greedy().numpy())
        return chosen.astype(np.int32, copy=False)


class TorchLearner(DQNSchedule, ReplayLearner):
    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        algo = cfg.algo
        self.algo, self.total_steps, self.num_envs = algo, cfg.total_steps, cfg.num_envs
        self.n_actions = int(action_space.n)
        # Drawn on the CPU (the global generator), then moved: the same weights anywhere.
        self.device = device_of(cfg.backend)
        self.q_network = q_network(obs_space, action_space, algo).to(self.device)
        self.target_network = q_network(obs_space, action_space, algo).to(self.device)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.optimizer = optimizer(algo.optimizer, self.q_network.parameters(), algo.learning_rate)
        self.updates = 0
        self.gamma = algo.gamma
        # The weights come from torch's global generator (seeded with the INIT stream).
        self.generator = torch.Generator().manual_seed(int_seed(seed, Stream.ACT))
        self.explore = EpsilonGreedy(cfg.num_envs, self.n_actions, self.generator)
        self.buffer = replay_buffer(obs_space, action_space, cfg, seed)

    def act(self, obs: AnyArray, step: int) -> np.ndarray:
        def greedy() -> torch.Tensor:
            # Only where some env does not explore: early in a run of few envs, most steps
            # skip the conversion and the network both.
            with torch.no_grad():
                # DLPack: NumPy and JAX arrays become tensors without a copy (on one device).
                q: torch.Tensor = self.q_network(from_dlpack(obs).to(self.device))
            return q.argmax(dim=1).cpu()

        return self.explore(greedy, self.epsilon(step))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return greedy_actions(self.q_network, obs)

    def update(self, batch: Batch[np.ndarray]) -> dict[str, torch.Tensor]:
        obs, next_obs, actions, rewards, dones = (from_numpy(x, self.device) for x in batch)
        with torch.no_grad():
            next_q = self.target_network(next_obs).max(dim=1).values
            td_target = rewards + self.gamma * next_q * (1.0 - dones)
        q = self.q_network(obs).gather(1, actions.long().unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(q, td_target)
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        if self.algo.anneal_lr:
            # Set directly: LambdaLR's bookkeeping cost more than the update's arithmetic.
            lr = learning_rate_at(self.updates, self.algo, self.total_steps, self.num_envs)
            self.optimizer.param_groups[0]["lr"] = lr
        self.optimizer.step()
        self.updates += 1
        return {"losses/td_loss": loss.detach(), "losses/q_values": q.detach().mean()}

    @torch.no_grad()
    def sync_target(self, weight: float) -> None:
        for target, online in zip(
            self.target_network.parameters(), self.q_network.parameters(), strict=True
        ):
            target.lerp_(online, weight)

    def state_dict(self) -> dict[str, Any]:
        """The resume state: networks, optimizer, update count, generator (and the run's
        step counts, action count and discount, the config's, as resume files have always
        held them)."""
        return {
            "total_steps": self.total_steps,
            "num_envs": self.num_envs,
            "n_actions": self.n_actions,
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "gamma": self.gamma,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q_network.load_state_dict(state["q_network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        self.generator.set_state(state["generator"])

    def agent_checkpoint(self) -> AgentCheckpoint:
        return {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Discrete,
) -> list[Policy]:
    """The greedy policy of a saved ``checkpoint.pt`` (``mode=eval``)."""
    network = q_network(obs_space, action_space, cfg.algo)
    network.load_state_dict(saved["q_network"])
    return [partial(greedy_actions, network)]
