"""Expected SARSA's learner: rlspeed's torch Q-table (acting, checkpoints, resume state and
``load_policies`` for ``mode=eval``) with one change, the update's target. Q-learning's
target takes the next state's best action; Expected SARSA's takes the mean over the
epsilon-greedy policy that acts, so it learns the values of the policy it follows."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlspeed.core.algos.networks.torch import from_numpy
from rlspeed.core.algos.qlearn.torch import TorchQTable, load_policies

__all__ = ["ExpectedSarsaTable", "load_policies"]


class ExpectedSarsaTable(TorchQTable):
    epsilon = 1.0

    def act(self, states: np.ndarray, step: int, epsilon: float) -> torch.Tensor:
        self.epsilon = epsilon  # the policy the update's target follows
        return super().act(states, step, epsilon)

    @torch.no_grad()
    def update(
        self,
        states: np.ndarray,
        actions: torch.Tensor,
        rewards: Any,
        next_states: np.ndarray,
        terminated: Any,
    ) -> dict[str, torch.Tensor]:
        s = from_numpy(states, self.device).long()
        a = actions.to(self.device).long()
        r = torch.from_dlpack(rewards).to(self.device, torch.float32)
        done = torch.from_dlpack(terminated).to(self.device, torch.float32)
        next_q = self.q[from_numpy(next_states, self.device).long()]
        # Epsilon-greedy: epsilon spread over every action, the rest over the best ones.
        best = (next_q == next_q.max(dim=1, keepdim=True).values).float()
        n_actions = next_q.shape[1]
        policy = self.epsilon / n_actions + (1 - self.epsilon) * best / best.sum(1, keepdim=True)
        td = r + self.gamma * (1 - done) * (policy * next_q).sum(dim=1) - self.q[s, a]
        # As Q-learning's table: transitions that hit the same (s, a) share one mean step.
        hits = torch.zeros_like(self.q).index_put_((s, a), torch.ones_like(td), accumulate=True)
        self.q.index_put_((s, a), self.alpha * td / hits[s, a], accumulate=True)
        return {"losses/td_error": td.abs().mean()}
