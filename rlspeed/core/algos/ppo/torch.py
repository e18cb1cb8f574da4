"""PPO in PyTorch, on any engine (Gymnasium or JAX through DLPack), top to bottom: each
iteration collects a rollout and its GAE advantages (``rlspeed/core/algos/rollout.py``, shared with
VPG), then the clipped surrogate loss over minibatches. The networks and acting are the
on-policy ``ActorCritic`` VPG has too (``rlspeed/core/algos/networks/torch.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from rlspeed.core.algos.networks.torch import (
    ActorCritic,
    from_numpy,
    saved_greedy_policy,
)
from rlspeed.core.algos.normalization import settings_of
from rlspeed.core.algos.ppo import (
    MinibatchSettings,
    PPOConfig,
    annealed_rate,
    batches_in_run,
    minibatch_positions,
)
from rlspeed.core.algos.rollout import RolloutBatch, RolloutLearner
from rlspeed.core.backends.torch import device_of
from rlspeed.core.tasks import Policy as GreedyPolicy
from rlspeed.seeding import Stream, int_seed

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.config import RunConfig
    from rlspeed.core import AgentCheckpoint

METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")


class MinibatchUpdates:
    """PPO's update of a batch (PQN's too): ``update_epochs`` passes over it in
    ``num_minibatches`` minibatches, one step of the learner's ``optimizer`` on its ``loss``
    each, after global-norm clipping; ``anneal_lr`` sets the step size per batch."""

    algo: MinibatchSettings
    device: torch.device
    optimizer: torch.optim.Optimizer
    # What the optimizer steps, what the gradient norm is clipped over.
    params: list[nn.Parameter]
    updates_per_batch: int
    # The run's batches and those done: the annealed step size's clock.
    batches: int
    batches_done: int
    minibatch_generator: torch.Generator

    def loss(
        self, minibatch: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch's (a ``RolloutBatch``'s fields) loss, and the metrics of the step."""
        raise NotImplementedError

    def update(
        self, batch: RolloutBatch, orders: torch.Tensor | np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """``update_epochs`` passes over the batch in ``num_minibatches`` minibatches, one
        gradient step each; metrics are the means over the steps. ``orders``
        [update_epochs, batch]: each pass's order (default: drawn permutations)."""
        algo = self.algo
        tensors = [from_numpy(x, self.device) for x in batch]
        size = len(tensors[0])
        if algo.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = annealed_rate(algo, self.batches_done, self.batches)
        self.batches_done += 1
        if orders is None:
            orders = torch.stack(
                [
                    torch.randperm(size, generator=self.minibatch_generator)
                    for _ in range(algo.update_epochs)
                ]
            )
        # A run's last batch may be cut short: any size, split as the flax update splits it.
        positions, _ = minibatch_positions(size, algo.num_minibatches, np)
        orders = torch.as_tensor(orders)[:, torch.as_tensor(positions)]
        minibatches = orders.reshape(self.updates_per_batch, -1).to(self.device)
        metrics: dict[str, list[torch.Tensor]] = {}
        for indices in minibatches:
            loss, step_metrics = self.loss(tuple(x[indices] for x in tensors))
            self.optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
            if algo.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(self.params, algo.max_grad_norm)
            self.optimizer.step()
            for name, value in step_metrics.items():
                metrics.setdefault(name, []).append(value)
        return {name: torch.stack(values).mean() for name, values in metrics.items()}


class TorchLearner(ActorCritic, MinibatchUpdates, RolloutLearner):
    algo: PPOConfig

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        cfg: RunConfig,
        seed: int,
    ) -> None:
        algo = self.algo = cfg.algo
        device = device_of(cfg.backend)
        super().__init__(obs_space, action_space, algo, seed, device, algo.orthogonal_init)
        self.updates_per_batch = algo.update_epochs * algo.num_minibatches
        self.params = [*self.policy.parameters(), *self.value.parameters()]
        # One Adam over both networks, with CleanRL's eps; the fused step (see
        # rlspeed.core.algos.networks.torch.optimizer).
        self.optimizer = torch.optim.Adam(self.params, lr=algo.learning_rate, eps=1e-5, fused=True)
        self.batches = batches_in_run(algo, cfg)
        self.batches_done = 0
        self.minibatch_generator = torch.Generator().manual_seed(int_seed(seed, Stream.REPLAY))
        self.init_rollout(obs_space, action_space, cfg, settings_of(algo, obs_space))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return super().greedy(self.seen(obs))

    def loss(
        self, minibatch: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch's total loss, and its parts as the metrics report them."""
        algo = self.algo
        obs, actions, old_log_probs, old_values, advantages, returns = minibatch
        dist = self.policy(obs)
        log_ratio = dist.log_prob(actions) - old_log_probs
        ratio = log_ratio.exp()
        entropy = dist.entropy().mean()
        if algo.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)
        clipped_ratio = ratio.clamp(1 - algo.clip_coef, 1 + algo.clip_coef)
        policy_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean()

        values = self.value(obs).squeeze(1)
        squared_error = (values - returns) ** 2
        if algo.clip_vloss:
            change = (values - old_values).clamp(-algo.clip_coef, algo.clip_coef)
            squared_error = torch.max(squared_error, (old_values + change - returns) ** 2)
        value_loss = 0.5 * squared_error.mean()

        total = policy_loss - algo.ent_coef * entropy + algo.vf_coef * value_loss
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clipfrac = ((ratio - 1).abs() > algo.clip_coef).float().mean()
        parts = (policy_loss, value_loss, entropy, approx_kl, clipfrac)
        return total, {f"losses/{name}": x.detach() for name, x in zip(METRICS, parts, strict=True)}

    def state_dict(self) -> dict[str, Any]:
        """The resume state: networks, optimizer, generators, the batches done (the learning
        rate's schedule), normalisation statistics (and the updates per batch and batches in
        the run, the config's, as resume files have always held them)."""
        return {
            **self.actor_critic_state(),
            "updates_per_batch": self.updates_per_batch,
            "optimizer": self.optimizer.state_dict(),
            "batches": self.batches,
            "batches_done": self.batches_done,
            "minibatch_generator": self.minibatch_generator.get_state(),
            **self.rollout_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_actor_critic_state(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.batches_done = state["batches_done"]
        self.minibatch_generator.set_state(state["minibatch_generator"])
        self.load_rollout_state(state)

    def agent_checkpoint(self) -> AgentCheckpoint:
        saved = {
            "policy": self.policy.state_dict(),
            "value": self.value.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        if self.normalization is not None and (stats := self.normalization.obs_moments()):
            saved["obs_norm"] = {name: torch.from_numpy(x) for name, x in stats.items()}
        return saved


def load_policies(
    cfg: RunConfig,
    saved: AgentCheckpoint,
    obs_space: spaces.Space[Any],
    action_space: spaces.Box | spaces.Discrete,
) -> list[GreedyPolicy]:
    """The greedy policy of a saved ``checkpoint.pt`` (``mode=eval``): with observation
    normalisation, on observations normalised by its saved statistics."""
    learner = TorchLearner(obs_space, action_space, cfg, cfg.seed)
    if learner.normalization is not None and learner.normalization.obs_moments() is not None:
        moments = saved["obs_norm"]
        learner.normalization.load_obs_moments({k: x.numpy() for k, x in moments.items()})
    return saved_greedy_policy(learner, saved)
