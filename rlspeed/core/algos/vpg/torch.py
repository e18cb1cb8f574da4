"""VPG in PyTorch, on any engine (Gymnasium or JAX through DLPack), top to bottom: each
iteration collects a rollout and its GAE advantages (``rlspeed/core/algos/rollout.py``, shared with
PPO), then one policy-gradient step and the value steps. The networks and acting are the
on-policy ``ActorCritic`` (``rlspeed/core/algos/networks/torch.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from rlspeed.core.algos.networks.torch import (
    ActorCritic,
    from_numpy,
    optimizer,
    saved_greedy_policy,
)
from rlspeed.core.algos.rollout import RolloutBatch, RolloutLearner
from rlspeed.core.backends.torch import device_of
from rlspeed.core.tasks import Policy as GreedyPolicy

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint


class TorchLearner(ActorCritic, RolloutLearner):
    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        algo = self.algo = cfg.algo
        super().__init__(obs_space, action_space, algo, seed, device_of(cfg.backend))
        self.updates_per_batch = 1 + algo.value_iterations
        self.policy_optimizer = optimizer("adam", self.policy.parameters(), algo.policy_lr)
        self.value_optimizer = optimizer("adam", self.value.parameters(), algo.value_lr)
        self.init_rollout(obs_space, action_space, cfg)

    def _step(self, optimizer: torch.optim.Optimizer, net: nn.Module, loss: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        if self.algo.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(net.parameters(), self.algo.max_grad_norm)
        optimizer.step()

    def update(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """One policy gradient step, then ``value_iterations`` full-batch value steps; the
        value loss reported is the mean over those steps."""
        algo = self.algo
        obs, actions, advantages, returns = (
            from_numpy(x, self.device)
            for x in (batch.obs, batch.actions, batch.advantages, batch.returns)
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

    def state_dict(self) -> dict[str, Any]:
        """The resume state: networks, optimizers, generator, normalisation statistics (and
        the updates per batch, the config's, as resume files have always held it)."""
        return {
            **self.actor_critic_state(),
            "updates_per_batch": self.updates_per_batch,
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "value_optimizer": self.value_optimizer.state_dict(),
            **self.rollout_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_actor_critic_state(state)
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.value_optimizer.load_state_dict(state["value_optimizer"])
        self.load_rollout_state(state)

    def agent_checkpoint(self) -> AgentCheckpoint:
        return {
            "policy": self.policy.state_dict(),
            "value": self.value.state_dict(),
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "value_optimizer": self.value_optimizer.state_dict(),
        }


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Box | spaces.Discrete,
) -> list[GreedyPolicy]:
    """The greedy policy of a saved ``checkpoint.pt`` (``mode=eval``)."""
    return saved_greedy_policy(TorchLearner(obs_space, action_space, cfg, cfg.seed), saved)
