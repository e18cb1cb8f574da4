"""SAC in PyTorch, on any engine (Gymnasium, or JAX through DLPack).

``TorchLearner`` runs under ``rlspeed.core.algos.loops.host.HostTraining``: each iteration
(``ReplayLearner.iteration``, shared with DQN and TD3) collects with ``act`` into the replay
buffer, then learns with ``update`` (soft targets from the target critics and the current
policy, the critics' loss and step, the delayed policy and entropy-coefficient steps, the
target critics' Polyak step) as often as due."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.utils.dlpack import from_dlpack

from rlspeed.core.algos.networks.torch import MLP, from_numpy, optimizer
from rlspeed.core.algos.replay import Batch, replay_buffer
from rlspeed.core.algos.sac import draw_normal, greedy_actions, sample
from rlspeed.core.algos.td3 import action_bounds, is_actor_step, uniform_actions
from rlspeed.core.algos.td3.torch import ActorCriticLearner, QNetwork, soft_update
from rlspeed.core.backends.torch import device_of
from rlspeed.core.tasks import Policy
from rlspeed.seeding import Stream, int_seed

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, AnyArray


class Actor(nn.Module):
    """The squashed Gaussian policy: one MLP outputs the means and the log stds."""

    def __init__(
        self,
        obs_space: spaces.Box,
        action_space: spaces.Box,
        hidden_sizes: list[int],
        device: torch.device,
    ) -> None:
        super().__init__()
        self.bounds = action_bounds(action_space, lambda x: from_numpy(x, device))
        action_dim = int(np.prod(action_space.shape))
        self.net = MLP(obs_space, 2 * action_dim, hidden_sizes, activation=nn.ReLU)

    def forward(self, obs: torch.Tensor, normal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions drawn with the standard-normal ``normal`` and their log-probabilities."""
        actions, log_prob = sample(self.net(obs), normal, self.bounds, torch)
        return actions, log_prob

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        actions: torch.Tensor = greedy_actions(self.net(obs), self.bounds, torch)
        return actions


class LogAlpha(nn.Module):
    """The entropy coefficient, as its log (tuned with ``autotune``, else fixed)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor(math.log(alpha)))


class TorchLearner(ActorCriticLearner):
    def __init__(
        self, obs_space: spaces.Box, action_space: spaces.Box, cfg: RunConfig, seed: int
    ) -> None:
        algo = self.algo = cfg.algo
        # Weights drawn on the CPU (the global generator), then moved: the same anywhere.
        device = self.device = device_of(cfg.backend)
        self.actor = Actor(obs_space, action_space, algo.hidden_sizes, device).to(device)
        # Random actions' bounds, beside the CPU generator that draws them.
        self.cpu_bounds = action_bounds(action_space, torch.from_numpy)
        self.qf1 = QNetwork(obs_space, action_space, algo.hidden_sizes).to(device)
        self.qf2 = QNetwork(obs_space, action_space, algo.hidden_sizes).to(device)
        self.qf1_target = copy.deepcopy(self.qf1)
        self.qf2_target = copy.deepcopy(self.qf2)
        self.log_alpha = LogAlpha(algo.alpha).to(device)
        self.target_entropy = -float(np.prod(action_space.shape))
        self.q_optimizer = optimizer(
            "adam", [*self.qf1.parameters(), *self.qf2.parameters()], algo.q_lr
        )
        self.actor_optimizer = optimizer("adam", self.actor.parameters(), algo.policy_lr)
        self.alpha_optimizer = optimizer("adam", self.log_alpha.parameters(), algo.q_lr)
        # The weights come from torch's global generator (seeded with the INIT stream).
        self.generator = torch.Generator().manual_seed(int_seed(seed, Stream.ACT))
        self.updates = 0
        # Each env's carried draws (``draw_normal``), on the CPU.
        self.noise = torch.zeros((cfg.num_envs, *self.cpu_bounds.low.shape))
        self.buffer = replay_buffer(obs_space, action_space, cfg, seed)

    @torch.no_grad()
    def act(self, obs: AnyArray, step: int) -> torch.Tensor:
        # DLPack: NumPy arrays and JAX arrays become tensors without a copy (on one device).
        obs = from_dlpack(obs).to(self.device)
        shape = (obs.shape[0], *self.cpu_bounds.low.shape)
        # Drawn on the CPU generator: the same draws on every device.
        actions: torch.Tensor
        if step < self.algo.learning_starts:
            actions = uniform_actions(torch.rand(shape, generator=self.generator), self.cpu_bounds)
        else:
            normal = torch.randn(shape, generator=self.generator)
            normal, self.noise = draw_normal(self.noise, normal, self.algo)
            actions = self.actor(obs, normal.to(self.device))[0].cpu()
        return actions

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.actor.greedy(from_numpy(obs, self.device)).cpu().numpy()

    def update(
        self, batch: Batch[np.ndarray], noise: torch.Tensor | np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """One critic update, plus ``policy_frequency`` policy (and entropy coefficient)
        updates every ``policy_frequency``-th. ``noise``: the policy's standard-normal draws
        [1 + policy_frequency, B, A], the next actions' and then each policy update's (drawn
        here unless given)."""
        algo = self.algo
        obs, next_obs, actions, rewards, dones = (from_numpy(x, self.device) for x in batch)
        if noise is None:
            noise = torch.randn(
                (1 + algo.policy_frequency, *actions.shape), generator=self.generator
            )
        noise = torch.as_tensor(noise).to(self.device)
        alpha = self.log_alpha.value.detach().exp()
        # Targets: the soft value of the next observation under the current policy.
        with torch.no_grad():
            next_actions, next_log_prob = self.actor(next_obs, noise[0])
            next_q = torch.min(
                self.qf1_target(next_obs, next_actions), self.qf2_target(next_obs, next_actions)
            )
            target = rewards + algo.gamma * (1.0 - dones) * (next_q - alpha * next_log_prob)
        q1, q2, qf1_loss, qf2_loss = self.critic_step(obs, actions, target)
        metrics = {
            "losses/qf1_values": q1.mean(),
            "losses/qf2_values": q2.mean(),
            "losses/qf1_loss": qf1_loss,
            "losses/qf2_loss": qf2_loss,
            "losses/qf_loss": (qf1_loss + qf2_loss) / 2,
            "losses/alpha": alpha,
        }
        self.updates += 1
        if is_actor_step(self.updates, algo):
            metrics |= self._update_policy(obs, noise[1:])
        soft_update(self.qf1_target, self.qf1, algo.tau)
        soft_update(self.qf2_target, self.qf2, algo.tau)
        return metrics

    def _update_policy(self, obs: torch.Tensor, noise: torch.Tensor) -> dict[str, torch.Tensor]:
        """One policy step per draw in ``noise``, each followed by the entropy coefficient's
        where it is tuned; their mean losses."""
        actor_losses, alpha_losses = [], []
        for normal in noise:
            alpha = self.log_alpha.value.detach().exp()
            actions, log_prob = self.actor(obs, normal)
            q = torch.min(self.qf1(obs, actions), self.qf2(obs, actions))
            actor_loss = (alpha * log_prob - q).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            actor_losses.append(actor_loss.detach())
            if self.algo.autotune:
                # Raise alpha while the entropy (-log_prob) is below its target, else lower it.
                entropy_gap = log_prob.detach() + self.target_entropy
                alpha_loss = -(self.log_alpha.value.exp() * entropy_gap).mean()
                self.alpha_optimizer.zero_grad()
                alpha_loss.backward()
                self.alpha_optimizer.step()
                alpha_losses.append(alpha_loss.detach())
        metrics = {"losses/actor_loss": torch.stack(actor_losses).mean()}
        if alpha_losses:
            metrics["losses/alpha_loss"] = torch.stack(alpha_losses).mean()
        return metrics

    def _networks_and_optimizers(self) -> dict[str, nn.Module | torch.optim.Optimizer]:
        return {
            "actor": self.actor,
            "qf1": self.qf1,
            "qf2": self.qf2,
            "qf1_target": self.qf1_target,
            "qf2_target": self.qf2_target,
            "log_alpha": self.log_alpha,
            "q_optimizer": self.q_optimizer,
            "actor_optimizer": self.actor_optimizer,
            "alpha_optimizer": self.alpha_optimizer,
        }


def load_policies(
    cfg: RunConfig, saved: AgentCheckpoint, obs_space: spaces.Box, action_space: spaces.Box
) -> list[Policy]:
    """The deterministic policy (the squashed mean) of a saved ``checkpoint.pt``
    (``mode=eval``)."""
    learner = TorchLearner(obs_space, action_space, cfg, cfg.seed)
    learner.actor.load_state_dict(saved["actor"])
    return [learner.greedy]
