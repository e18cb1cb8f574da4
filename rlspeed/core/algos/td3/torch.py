"""TD3 in PyTorch, on any engine (Gymnasium, or JAX through DLPack).

``TorchLearner`` runs under ``rlspeed.core.algos.loops.host.HostTraining``: each iteration
(``ReplayLearner.iteration``, shared with DQN) collects with ``act`` into the replay buffer,
then learns with ``update`` (smoothed targets from the target networks, the critics' loss
and step, the delayed actor and target updates) as often as due. ``ActorCriticLearner``
and the networks are SAC's too."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.dlpack import from_dlpack

from rlspeed.core.algos.networks.torch import from_numpy, lecun_normal_, optimizer
from rlspeed.core.algos.replay import Batch, ReplayLearner, replay_buffer
from rlspeed.core.algos.td3 import (
    action_bounds,
    draw_noise,
    explore,
    is_actor_step,
    restart_noise,
    smoothed_target_actions,
    squash,
    uniform_actions,
)
from rlspeed.core.backends.torch import device_of
from rlspeed.core.tasks import Policy
from rlspeed.seeding import Stream, int_seed

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, AnyArray


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [lecun_normal_(nn.Linear(fan_in, fan_out)), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Actor(nn.Module):
    def __init__(
        self,
        obs_space: spaces.Box,
        action_space: spaces.Box,
        hidden_sizes: Sequence[int],
        device: torch.device,
    ) -> None:
        super().__init__()
        self.bounds = action_bounds(action_space, lambda x: from_numpy(x, device))
        obs_dim, action_dim = int(np.prod(obs_space.shape)), int(np.prod(action_space.shape))
        self.net = mlp([obs_dim, *hidden_sizes, action_dim])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        actions: torch.Tensor = squash(self.net(obs.flatten(1).float()), self.bounds, torch)
        return actions


class QNetwork(nn.Module):
    def __init__(
        self, obs_space: spaces.Box, action_space: spaces.Box, hidden_sizes: Sequence[int]
    ) -> None:
        super().__init__()
        obs_dim, action_dim = int(np.prod(obs_space.shape)), int(np.prod(action_space.shape))
        self.net = mlp([obs_dim + action_dim, *hidden_sizes, 1])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        q: torch.Tensor = self.net(torch.cat([obs.flatten(1).float(), actions.float()], dim=1))
        return q.squeeze(1)


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging: ``target`` moves by ``tau`` of the way to ``online``."""
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.lerp_(o, tau)


class ActorCriticLearner(ReplayLearner):
    """What TD3's and SAC's torch learners share besides the replay iteration: a CPU
    generator for their random draws, a count of critic updates (which says when the actor
    learns), each env's exploration noise carried between steps (OU exploration's; zeros
    otherwise), and networks and optimizers by name (``_networks_and_optimizers``) that make
    the agent file and, with the generator, the count and the noise, the resume state."""

    generator: torch.Generator
    updates: int
    noise: torch.Tensor  # [num_envs, *action_shape], on the CPU
    qf1: QNetwork
    qf2: QNetwork
    q_optimizer: torch.optim.Optimizer

    def critic_step(
        self, obs: torch.Tensor, actions: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of the twin critics' regression onto ``target`` [B], TD3's and SAC's
        alike: Q1's and Q2's values and losses, detached."""
        q1, q2 = self.qf1(obs, actions), self.qf2(obs, actions)
        qf1_loss, qf2_loss = F.mse_loss(q1, target), F.mse_loss(q2, target)
        self.q_optimizer.zero_grad()
        (qf1_loss + qf2_loss).backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        self.q_optimizer.step()
        return q1.detach(), q2.detach(), qf1_loss.detach(), qf2_loss.detach()

    def _networks_and_optimizers(self) -> dict[str, nn.Module | torch.optim.Optimizer]:
        """What the agent file and the resume state hold of the learner, by name."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The resume state: networks, optimizers, generator, update count, carried noise."""
        parts = self._networks_and_optimizers().items()
        state: dict[str, Any] = {name: part.state_dict() for name, part in parts}
        state |= {"generator": self.generator.get_state(), "updates": self.updates}
        return state | {"noise": self.noise}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, part in self._networks_and_optimizers().items():
            part.load_state_dict(state[name])
        self.generator.set_state(state["generator"])
        self.updates = state["updates"]
        # Resume files from before OU exploration hold no noise: Gaussian noise carries none.
        self.noise = torch.as_tensor(state.get("noise", self.noise))

    def episodes_ended(self, ended: np.ndarray) -> None:
        self.noise = restart_noise(self.noise, torch.from_numpy(ended))

    def agent_checkpoint(self) -> AgentCheckpoint:
        parts = self._networks_and_optimizers().items()
        return {name: part.state_dict() for name, part in parts}


class TorchLearner(ActorCriticLearner):
    def __init__(
        self, obs_space: spaces.Box, action_space: spaces.Box, cfg: RunConfig, seed: int
    ) -> None:
        algo = self.algo = cfg.algo
        # Weights drawn on the CPU (the global generator), then moved: the same anywhere.
        device = self.device = device_of(cfg.backend)
        self.actor = Actor(obs_space, action_space, algo.hidden_sizes, device).to(device)
        self.bounds = self.actor.bounds
        # Exploration's bounds, beside the CPU generator that draws its noise.
        self.cpu_bounds = action_bounds(action_space, torch.from_numpy)
        self.qf1 = QNetwork(obs_space, action_space, algo.hidden_sizes).to(device)
        self.qf2 = QNetwork(obs_space, action_space, algo.hidden_sizes).to(device)
        self.actor_target = copy.deepcopy(self.actor)
        self.qf1_target = copy.deepcopy(self.qf1)
        self.qf2_target = copy.deepcopy(self.qf2)
        self.q_optimizer = optimizer(
            "adam", [*self.qf1.parameters(), *self.qf2.parameters()], algo.learning_rate
        )
        self.actor_optimizer = optimizer("adam", self.actor.parameters(), algo.learning_rate)
        # The weights come from torch's global generator (seeded with the INIT stream).
        self.generator = torch.Generator().manual_seed(int_seed(seed, Stream.ACT))
        self.updates = 0
        # Each env's exploration noise, carried between steps (``draw_noise``), on the CPU.
        self.noise = torch.zeros((cfg.num_envs, *self.cpu_bounds.low.shape))
        self.buffer = replay_buffer(obs_space, action_space, cfg, seed)

    @torch.no_grad()
    def act(self, obs: AnyArray, step: int) -> torch.Tensor:
        # DLPack: NumPy arrays and JAX arrays become tensors without a copy (on one device).
        obs = from_dlpack(obs).to(self.device)
        shape = (obs.shape[0], *self.bounds.low.shape)
        # Drawn on the CPU generator, explored on the CPU: the same actions on every device,
        # and where engines take them.
        actions: torch.Tensor
        if step < self.algo.learning_starts:
            actions = uniform_actions(torch.rand(shape, generator=self.generator), self.cpu_bounds)
        else:
            normal = torch.randn(shape, generator=self.generator)
            noise, self.noise = draw_noise(self.noise, normal, self.algo)
            actions = explore(self.actor(obs).cpu(), noise, self.cpu_bounds, torch)
        return actions

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        actions: torch.Tensor = self.actor(from_numpy(obs, self.device))
        return actions.cpu().numpy()

    def update(
        self, batch: Batch[np.ndarray], noise: torch.Tensor | np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """One critic update, plus the actor and target updates every ``policy_frequency``.
        ``noise``: the standard-normal draws of target policy smoothing (drawn here unless
        given)."""
        algo = self.algo
        obs, next_obs, actions, rewards, dones = (from_numpy(x, self.device) for x in batch)
        with torch.no_grad():
            if noise is None:
                noise = torch.randn(actions.shape, generator=self.generator)
            noise = torch.as_tensor(noise).to(self.device)
            next_actions = smoothed_target_actions(
                self.actor_target(next_obs), noise, self.bounds, algo, torch
            )
            next_q = torch.min(
                self.qf1_target(next_obs, next_actions), self.qf2_target(next_obs, next_actions)
            )
            target = rewards + algo.gamma * (1.0 - dones) * next_q
        q1, _, qf1_loss, qf2_loss = self.critic_step(obs, actions, target)
        metrics = {
            "losses/qf1_loss": qf1_loss,
            "losses/qf2_loss": qf2_loss,
            "losses/qf1_values": q1.mean(),
        }
        self.updates += 1
        if is_actor_step(self.updates, algo):
            actor_loss = -self.qf1(obs, self.actor(obs)).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            self._update_targets()
            metrics["losses/actor_loss"] = actor_loss.detach()
        return metrics

    def _update_targets(self) -> None:
        for target, online in (
            (self.actor_target, self.actor),
            (self.qf1_target, self.qf1),
            (self.qf2_target, self.qf2),
        ):
            soft_update(target, online, self.algo.tau)

    def _networks_and_optimizers(self) -> dict[str, nn.Module | torch.optim.Optimizer]:
        return {
            "actor": self.actor,
            "qf1": self.qf1,
            "qf2": self.qf2,
            "actor_target": self.actor_target,
            "qf1_target": self.qf1_target,
            "qf2_target": self.qf2_target,
            "q_optimizer": self.q_optimizer,
            "actor_optimizer": self.actor_optimizer,
        }


def load_policies(
    cfg: RunConfig, saved: AgentCheckpoint, obs_space: spaces.Box, action_space: spaces.Box
) -> list[Policy]:
    """The deterministic policy of a saved ``checkpoint.pt`` (``mode=eval``)."""
    learner = TorchLearner(obs_space, action_space, cfg, cfg.seed)
    learner.actor.load_state_dict(saved["actor"])
    return [learner.greedy]
