"""Tabular Q-learning in PyTorch, on any engine (Gymnasium or JAX through DLPack).

``TorchQTable`` runs under ``rlspeed.core.algos.loops.host.HostTraining``: each iteration
(``QTableLearner.iteration``, shared with flax's table) collects with ``act`` and updates
the table with ``update`` (the TD targets and the averaged step of ``td_update_``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from rlspeed.core.algos.networks.torch import from_numpy
from rlspeed.core.algos.qlearn import QTableLearner, table_shape
from rlspeed.core.backends.torch import device_of
from rlspeed.core.state import check_shape, load_array
from rlspeed.core.tasks import Policy
from rlspeed.registry import TASKS
from rlspeed.seeding import Stream, int_seed

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, XpArray


def explore_greedy(
    q: torch.Tensor, states: torch.Tensor, u: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """Epsilon-greedy with random tie-breaking, from one uniform number per env (``u``):
    below epsilon it explores, and rescaled to [0, 1) within its branch it picks which of
    the candidates (all actions when exploring, else the maximal ones). As in flax.py."""
    values = q[states]
    explore = u < epsilon
    candidates = explore[:, None] | (values == values.max(dim=1, keepdim=True).values)
    v = torch.where(explore, u / epsilon, (u - epsilon) / (1.0 - epsilon))
    count = candidates.sum(dim=1)
    pick = torch.minimum((v * count).long(), count - 1)
    # The action of the pick-th candidate (0-based), in action order.
    return (candidates.cumsum(dim=1) <= pick[:, None]).sum(dim=1)


@torch.no_grad()
def td_update_(
    q: torch.Tensor,
    states: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    next_states: torch.Tensor,
    terminated: torch.Tensor,
    alpha: float,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``Q[s, a] += alpha * mean(td)`` over the batch's transitions at each ``(s, a)``, in
    place; returns the TD errors and ``Q[s, a]`` (both of the table before the update)."""
    n_actions = q.shape[1]
    q_sa = q[states, actions]
    next_value = q[next_states].max(dim=1).values
    td = rewards + gamma * (1.0 - terminated.float()) * next_value - q_sa
    index = states * n_actions + actions
    flat = q.view(-1)
    hits = torch.zeros_like(flat).index_add_(0, index, torch.ones_like(td))[index]
    flat.index_add_(0, index, alpha * td / hits)
    return td, q_sa


class TorchQTable(QTableLearner):
    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        super().__init__(cfg)
        self.alpha, self.gamma = cfg.algo.alpha, cfg.algo.gamma
        self.device = device_of(cfg.backend)
        self.q = torch.zeros(*table_shape(cfg, action_space), device=self.device)
        self.generator = torch.Generator().manual_seed(int_seed(seed, Stream.ACT))

    def act(self, states: np.ndarray, step: int, epsilon: float) -> torch.Tensor:
        # Drawn on the CPU generator: the same exploration on every device.
        u = torch.rand(len(states), generator=self.generator).to(self.device)
        actions = explore_greedy(self.q, from_numpy(states, self.device), u, epsilon)
        # int32 is what the JAX engine takes with x64 disabled; on the CPU, as engines take.
        return actions.to(torch.int32).cpu()

    def greedy_states(self, states: np.ndarray) -> np.ndarray:
        return self.q[from_numpy(states, self.device)].argmax(dim=1).cpu().numpy()

    def update(
        self,
        states: np.ndarray,
        actions: torch.Tensor,
        rewards: XpArray,
        next_states: np.ndarray,
        terminated: XpArray,
    ) -> dict[str, torch.Tensor]:
        # DLPack: NumPy and JAX arrays become tensors without a copy.
        td, q_sa = td_update_(
            self.q,
            from_numpy(states, self.device).long(),
            actions.to(self.device).long(),
            from_dlpack(rewards).to(self.device),
            from_numpy(next_states, self.device).long(),
            from_dlpack(terminated).to(self.device),
            self.alpha,
            self.gamma,
        )
        return {"losses/td_error": td.abs().mean(), "losses/q_values": q_sa.mean()}

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the table and the generator (and the step size and discount,
        the config's, as resume files have always held them)."""
        return {
            "alpha": self.alpha,
            "gamma": self.gamma,
            "q": self.q.detach().clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_array("q", self.q, state["q"])
        self.generator.set_state(state["generator"])

    def agent_checkpoint(self) -> AgentCheckpoint:
        return {"q_table": self.q}


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Discrete,
) -> list[Policy]:
    """The greedy policy of a saved ``checkpoint.pt`` (``mode=eval``)."""
    q: torch.Tensor = saved["q_table"]
    check_shape("q_table", q.shape, table_shape(cfg, action_space))
    tabular = TASKS.get(cfg.task.name).tabular

    def greedy(obs: np.ndarray) -> np.ndarray:
        return q[torch.from_numpy(tabular.state_index(cfg.task, obs, np))].argmax(dim=1).numpy()

    return [greedy]
