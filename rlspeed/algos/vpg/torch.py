"""VPG in PyTorch, on any engine (Gymnasium or JAX through DLPack)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from rlspeed.algos.loops.onpolicy import RolloutBatch
from rlspeed.algos.networks.torch import MLP, optimizer
from rlspeed.checkpoint import save_torch
from rlspeed.seeding import Stream, int_seed
from rlspeed.tasks import Policy as GreedyPolicy


class Policy(nn.Module):
    """Categorical over logits (discrete actions), or a diagonal Gaussian with a learned,
    state-independent log std (continuous actions)."""

    def __init__(self, obs_space: Any, action_space: Any, algo: Any) -> None:
        super().__init__()
        self.continuous = bool(action_space.shape)
        out_size = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        self.net = MLP(obs_space, out_size, algo.hidden_sizes)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((out_size,), float(algo.initial_log_std)))

    def forward(self, obs: torch.Tensor) -> Distribution:
        out = self.net(obs)
        if self.continuous:
            # Independent: log-probabilities and entropies summed over the action dimensions.
            normal = Normal(out, self.log_std.exp(), validate_args=False)
            return Independent(normal, 1, validate_args=False)
        return Categorical(logits=out, validate_args=False)


class TorchLearner:
    def __init__(self, obs_space: Any, action_space: Any, cfg: Any, seed: int) -> None:
        algo = self.algo = cfg.algo
        self.updates_per_batch = 1 + algo.value_iterations
        self.policy = Policy(obs_space, action_space, algo)
        self.value = MLP(obs_space, 1, algo.hidden_sizes)
        self.policy_optimizer = optimizer("adam", self.policy.parameters(), algo.policy_lr)
        self.value_optimizer = optimizer("adam", self.value.parameters(), algo.value_lr)
        if self.policy.continuous:
            self.low = torch.as_tensor(action_space.low)
            self.high = torch.as_tensor(action_space.high)
        # The weights come from torch's global generator (seeded with the INIT stream).
        self.generator = torch.Generator().manual_seed(int_seed(seed, Stream.ACT))

    @torch.no_grad()
    def act(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # DLPack: NumPy arrays and JAX arrays become tensors without a copy.
        dist = self.policy(torch.from_dlpack(obs))
        if self.policy.continuous:
            noise = torch.randn(dist.mean.shape, generator=self.generator)
            actions = dist.mean + dist.stddev * noise
            return actions, actions.clamp(self.low, self.high), dist.log_prob(actions)
        actions = torch.multinomial(dist.probs, 1, generator=self.generator).squeeze(1)
        # int32 is what the JAX engine takes with x64 disabled.
        actions = actions.to(torch.int32)
        return actions, actions, dist.log_prob(actions)

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        return self.value(torch.from_numpy(obs)).squeeze(1).numpy()

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        dist = self.policy(torch.from_numpy(obs))
        if self.policy.continuous:
            return dist.mean.clamp(self.low, self.high).numpy()
        return dist.logits.argmax(dim=1).numpy()

    def _step(self, optimizer: torch.optim.Optimizer, net: nn.Module, loss: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss.backward()
        if self.algo.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(net.parameters(), self.algo.max_grad_norm)
        optimizer.step()

    def update(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """One policy gradient step, then ``value_iterations`` full-batch value steps; the
        value loss reported is the mean over those steps."""
        algo = self.algo
        obs, actions, advantages, returns = (
            torch.from_numpy(x) for x in (batch.obs, batch.actions, batch.advantages, batch.returns)
        )
        if algo.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)

        dist = self.policy(obs)
        policy_loss = -(dist.log_prob(actions) * advantages).mean()
        entropy = dist.entropy().mean()
        self._step(self.policy_optimizer, self.policy, policy_loss - algo.ent_coef * entropy)

        value_losses = []
        for _ in range(algo.value_iterations):
            value_loss = F.mse_loss(self.value(obs).squeeze(1), returns)
            self._step(self.value_optimizer, self.value, value_loss)
            value_losses.append(value_loss.detach())
        return {
            "losses/policy_loss": policy_loss.detach(),
            "losses/value_loss": torch.stack(value_losses).mean(),
            "losses/entropy": entropy.detach(),
        }

    def save(self, path: Path) -> Path:
        return save_torch(
            {
                "policy": self.policy.state_dict(),
                "value": self.value.state_dict(),
                "policy_optimizer": self.policy_optimizer.state_dict(),
                "value_optimizer": self.value_optimizer.state_dict(),
            },
            path,
        )


def load_policies(cfg: Any, path: Path, obs_space: Any, action_space: Any) -> list[GreedyPolicy]:
    """The greedy policy of a saved ``checkpoint.pt`` (``mode=eval``)."""
    learner = TorchLearner(obs_space, action_space, cfg, cfg.seed)
    learner.policy.load_state_dict(torch.load(path, weights_only=True)["policy"])
    return [learner.greedy]
