"""PQN in PyTorch, on any engine (Gymnasium or JAX through DLPack), top to bottom: each
iteration collects a rollout epsilon-greedily and its Q(lambda) returns (the on-policy
rollouts of ``rlspeed/core/algos/rollout.py`` with the values max_a Q), then PPO's
minibatched passes (``MinibatchUpdates``) on the squared error of Q(s, a) to them."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.dlpack import from_dlpack

from rlspeed.core.algos.dqn.torch import EpsilonGreedy, greedy_actions
from rlspeed.core.algos.encoding import through_torso
from rlspeed.core.algos.networks.torch import MLP, from_numpy
from rlspeed.core.algos.ppo import batches_in_run
from rlspeed.core.algos.ppo.torch import MinibatchUpdates
from rlspeed.core.algos.pqn import PQNConfig
from rlspeed.core.algos.rollout import RolloutBatch, RolloutLearner
from rlspeed.core.algos.schedule import epsilon_at
from rlspeed.core.backends.torch import device_of
from rlspeed.core.tasks import Policy
from rlspeed.seeding import Stream, int_seed

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint, XpArray


def q_network(obs_space: spaces.Space[Any], action_space: spaces.Discrete, cfg: RunConfig) -> MLP:
    """Observations (through the conv torso where they are images) -> Q-value of every
    action: hidden layers with LayerNorm and ReLU."""
    n_actions, algo = int(action_space.n), cfg.algo
    torso = through_torso(obs_space, algo.network)
    return MLP(obs_space, n_actions, algo.hidden_sizes, nn.ReLU, layer_norm=True, torso=torso)


class TorchLearner(MinibatchUpdates, RolloutLearner):
    algo: PQNConfig

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        algo = self.algo = cfg.algo
        self.n_actions = int(action_space.n)
        # Drawn on the CPU (the global generator, seeded with the INIT stream), then moved:
        # the same weights anywhere.
        self.device = device_of(cfg.backend)
        self.q_network = q_network(obs_space, action_space, cfg).to(self.device)
        self.params = list(self.q_network.parameters())
        # PPO's Adam (eps 1e-5), with the fused step.
        self.optimizer = torch.optim.Adam(self.params, lr=algo.learning_rate, eps=1e-5, fused=True)
        self.updates_per_batch = algo.update_epochs * algo.num_minibatches
        self.batches = batches_in_run(algo, cfg)
        self.batches_done = 0
        # Env steps collected so far: the exploration rate's clock (the flax agent's too).
        self.steps = 0
        self.generator = torch.Generator().manual_seed(int_seed(seed, Stream.ACT))
        self.explore = EpsilonGreedy(cfg.num_envs, self.n_actions, self.generator)
        self.minibatch_generator = torch.Generator().manual_seed(int_seed(seed, Stream.REPLAY))
        self.init_rollout(obs_space, action_space, cfg)

    def epsilon(self) -> float:
        return float(epsilon_at(self.steps, self.algo, self.total_steps))

    @torch.no_grad()
    def act(self, obs: XpArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Epsilon-greedy actions, as the rollout stores them: (actions, the same sent to the
        env, log-probabilities: zeros, which PQN does not read)."""
        # DLPack: NumPy arrays and JAX arrays become tensors without a copy (on one device).
        tensor = from_dlpack(obs).to(self.device)

        def greedy() -> torch.Tensor:
            q: torch.Tensor = self.q_network(tensor)
            return q.argmax(dim=1).cpu()

        actions = self.explore(greedy, self.epsilon())
        return actions, actions, np.zeros(len(tensor), np.float32)

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        """max_a Q(obs, a): what the Q(lambda) returns bootstrap from."""
        q: torch.Tensor = self.q_network(from_numpy(obs, self.device))
        return q.max(dim=1).values.cpu().numpy()

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return greedy_actions(self.q_network, obs)

    def loss(
        self, minibatch: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The squared error of Q(s, a) to the Q(lambda) return."""
        batch = RolloutBatch(*minibatch)
        q_all = self.q_network(batch.obs)
        q = q_all.gather(1, batch.actions.long().unsqueeze(1)).squeeze(1)
        td_loss = ((q - batch.returns) ** 2).mean()
        return td_loss, {"losses/td_loss": td_loss.detach(), "losses/q_values": q.detach().mean()}

    def update(
        self, batch: RolloutBatch, orders: torch.Tensor | np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """PPO's passes over the batch (``orders``: see ``MinibatchUpdates.update``), with
        the exploration rate the batch was collected at."""
        epsilon = self.epsilon()
        metrics = super().update(batch, orders)
        self.steps += len(batch.obs)
        return metrics | {"charts/epsilon": torch.tensor(epsilon)}

    def state_dict(self) -> dict[str, Any]:
        """The resume state: network, optimizer, generators, the batches and env steps done
        (the step size's and the exploration rate's clocks)."""
        return {
            "q_network": self.q_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "batches_done": self.batches_done,
            "steps": self.steps,
            "generator": self.generator.get_state(),
            "minibatch_generator": self.minibatch_generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q_network.load_state_dict(state["q_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.batches_done = state["batches_done"]
        self.steps = state["steps"]
        self.generator.set_state(state["generator"])
        self.minibatch_generator.set_state(state["minibatch_generator"])

    def agent_checkpoint(self) -> AgentCheckpoint:
        return {"q_network": self.q_network.state_dict(), "optimizer": self.optimizer.state_dict()}


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Discrete,
) -> list[Policy]:
    """The greedy policy of a saved ``checkpoint.pt`` (``mode=eval``)."""
    network = q_network(obs_space, action_space, cfg)
    network.load_state_dict(saved["q_network"])
    return [partial(greedy_actions, network)]
