"""The shared MLP in PyTorch (observations, one-hot encoded where categorical or through the
conv torso where images -> MLP), the optimizers every torch learner builds, and the
stochastic actor-critic of the on-policy algorithms (VPG, PPO)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal
from torch.utils.dlpack import from_dlpack

from rlspeed.core.algos.encoding import input_size, one_hot_classes, through_torso
from rlspeed.core.algos.networks import (
    CONV_CHANNELS,
    CONV_KERNEL,
    HIDDEN_GAIN,
    LAYER_NORM_EPSILON,
    POLICY_GAIN,
    VALUE_GAIN,
    ActorCriticSettings,
    torso_size,
)
from rlspeed.seeding import Stream, int_seed

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlspeed.core import AgentCheckpoint, XpArray


# A dense or a conv layer: the inits below treat each weight's fan-in alike.
Layer = TypeVar("Layer", nn.Linear, nn.Conv2d)


def zero_bias(layer: Layer) -> Layer:
    # Every layer here is built with a bias (torch's default); a conv's is typed optional.
    assert layer.bias is not None
    nn.init.zeros_(layer.bias)
    return layer


def lecun_normal_(layer: Layer) -> Layer:
    """Flax's default init (truncated LeCun normal, zero bias), so both stacks start alike."""
    # Inputs to one output: a dense layer's in_features, a conv's kernel area x channels.
    fan_in = layer.weight[0].numel()
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
    nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
    return zero_bias(layer)


def optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Adam or SGD with the fused step: one kernel over all parameters, also on CPU. It
    computes the same update and takes DQN's on CartPole from 610 to 447 us ([64, 64],
    batch 64), on Doors from 1.80 to 1.51 ms."""
    kinds: dict[str, Callable[..., torch.optim.Optimizer]] = {
        "adam": torch.optim.Adam,
        "sgd": torch.optim.SGD,
    }
    return kinds[name](params, lr=lr, fused=True)


def device_of_module(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def from_numpy(x: np.ndarray, device: torch.device) -> torch.Tensor:
    """A NumPy array as a tensor on ``device`` (sharing its memory on the CPU)."""
    return torch.from_numpy(np.asarray(x)).to(device)


def orthogonal_(layer: Layer, gain: float) -> Layer:
    """Orthogonal weights scaled by ``gain``, zero bias (``orthogonal_init``)."""
    nn.init.orthogonal_(layer.weight, gain)
    return zero_bias(layer)


def image_features(images: torch.Tensor, torso: nn.Module) -> torch.Tensor:
    """Images [B, H, W, C] (as envs give them) through ``torso`` (channels first, as torch's
    convolutions take them), flattened in flax's (H, W, channel) order, so one dense weight
    fits both backends. uint8 images (camera frames) are scaled to [0, 1]."""
    x = images.float()
    if images.dtype == torch.uint8:
        x = x / 255.0
    features: torch.Tensor = torso(x.permute(0, 3, 1, 2))
    return features.permute(0, 2, 3, 1).flatten(1)


class MLP(nn.Module):
    """Observations -> ``activation`` after each hidden layer -> ``out_size`` outputs.
    ``output_gain``: orthogonal weights (``HIDDEN_GAIN`` in the hidden layers and the conv
    torso, this gain on the output; biases 0) instead of LeCun normal. ``layer_norm``: a
    LayerNorm between each hidden layer and its activation (PQN). ``torso``: image
    observations go through the conv torso (``CONV_CHANNELS``, each conv followed by a
    ReLU) into the first hidden layer (``rlspeed.core.algos.encoding.through_torso``)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        out_size: int,
        hidden_sizes: Sequence[int],
        activation: type[nn.Module] = nn.Tanh,
        output_gain: float | None = None,
        layer_norm: bool = False,
        torso: bool = False,
    ) -> None:
        super().__init__()
        self.classes = one_hot_classes(obs_space)

        def init(layer: Layer, gain: float | None) -> Layer:
            if output_gain is None or gain is None:
                return lecun_normal_(layer)
            return orthogonal_(layer, gain)

        self.torso: nn.Sequential | None = None
        inputs = input_size(obs_space)
        if torso:
            # Never None: an image's shape (H, W, C).
            image = cast("tuple[int, int, int]", obs_space.shape)
            convs: list[nn.Module] = []
            channels = image[2]
            for out_channels in CONV_CHANNELS:
                conv = nn.Conv2d(channels, out_channels, CONV_KERNEL)
                convs += [init(conv, HIDDEN_GAIN), nn.ReLU()]
                channels = out_channels
            self.torso = nn.Sequential(*convs)
            inputs = torso_size(image).features
        sizes = [inputs, *hidden_sizes]
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers.append(init(nn.Linear(fan_in, fan_out), HIDDEN_GAIN))
            if layer_norm:
                layers.append(nn.LayerNorm(fan_out, eps=LAYER_NORM_EPSILON))
            layers.append(activation())
        layers.append(init(nn.Linear(sizes[-1], out_size), output_gain))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.torso is not None:
            x = image_features(obs, self.torso)
        elif self.classes:
            x = F.one_hot(obs.long(), self.classes).flatten(1).float()
        else:
            x = obs.flatten(1).float()
        out: torch.Tensor = self.net(x)
        return out


class Policy(nn.Module):
    """Categorical over logits (discrete actions), or a diagonal Gaussian with a learned,
    state-independent log std (continuous actions)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        algo: ActorCriticSettings,
        output_gain: float | None = None,
    ) -> None:
        super().__init__()
        self.continuous = bool(action_space.shape)
        # A Box where the actions are continuous (they have a shape), else a Discrete.
        out_size = (
            int(np.prod(cast("spaces.Box", action_space).shape))
            if self.continuous
            else int(cast("spaces.Discrete", action_space).n)
        )
        torso = through_torso(obs_space, algo.network)
        self.net = MLP(obs_space, out_size, algo.hidden_sizes, output_gain=output_gain, torso=torso)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((out_size,), float(algo.initial_log_std)))

    def forward(self, obs: torch.Tensor) -> Distribution:
        out = self.net(obs)
        if self.continuous:
            # Independent: log-probabilities and entropies summed over the action dimensions.
            normal = Normal(out, self.log_std.exp(), validate_args=False)
            return Independent(normal, 1, validate_args=False)
        return Categorical(logits=out, validate_args=False)


class ActorCritic:
    """The policy and value networks of an on-policy learner (``algo.hidden_sizes``,
    ``algo.initial_log_std``) and how it acts; the algorithm adds its optimizers and update.
    ``orthogonal``: orthogonal init (see ``MLP``)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        algo: ActorCriticSettings,
        seed: int,
        device: torch.device | None = None,
        orthogonal: bool = False,
    ) -> None:
        # Weights drawn on the CPU (the global generator), then moved: the same anywhere.
        self.device = device or torch.device("cpu")
        policy_gain, value_gain = (POLICY_GAIN, VALUE_GAIN) if orthogonal else (None, None)
        self.policy = Policy(obs_space, action_space, algo, policy_gain).to(self.device)
        torso = through_torso(obs_space, algo.network)
        self.value = MLP(obs_space, 1, algo.hidden_sizes, output_gain=value_gain, torso=torso)
        self.value.to(self.device)
        if self.policy.continuous:
            box = cast("spaces.Box", action_space)
            self.low = from_numpy(box.low, self.device)
            self.high = from_numpy(box.high, self.device)
        # The weights come from torch's global generator (seeded with the INIT stream).
        self.generator = torch.Generator().manual_seed(int_seed(seed, Stream.ACT))

    @torch.no_grad()
    def act(self, obs: XpArray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sampled actions: (as sampled, as sent to the env: clipped to the bounds, their
        log-probabilities), on the CPU, where the loop stores them and engines take them."""
        # DLPack: NumPy arrays and JAX arrays become tensors without a copy (on one device).
        dist = self.policy(from_dlpack(obs).to(self.device))
        # Drawn with the CPU generator: the same samples on every device.
        if self.policy.continuous:
            noise = torch.randn(dist.mean.shape, generator=self.generator).to(self.device)
            actions = dist.mean + dist.stddev * noise
            clipped = actions.clamp(self.low, self.high)
            return actions.cpu(), clipped.cpu(), dist.log_prob(actions).cpu()
        sampled = torch.multinomial(dist.probs.cpu(), 1, generator=self.generator).squeeze(1)
        # int32 is what the JAX engine takes with x64 disabled.
        actions = sampled.to(torch.int32)
        return actions, actions, dist.log_prob(actions.to(self.device)).cpu()

    def actor_critic_state(self) -> dict[str, Any]:
        """The networks and the generator actions are drawn from (and the action bounds,
        the action space's, as resume files have always held them): the part of an
        on-policy learner's ``state_dict`` this class holds."""
        state: dict[str, Any] = {
            "policy": self.policy.state_dict(),
            "value": self.value.state_dict(),
        }
        if self.policy.continuous:
            state |= {"low": self.low.detach().clone(), "high": self.high.detach().clone()}
        return state | {"generator": self.generator.get_state()}

    def load_actor_critic_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.value.load_state_dict(state["value"])
        self.generator.set_state(state["generator"])

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        values: torch.Tensor = self.value(from_numpy(obs, self.device))
        return values.squeeze(1).cpu().numpy()

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        dist = self.policy(from_numpy(obs, self.device))
        actions: torch.Tensor
        if self.policy.continuous:
            actions = dist.mean.clamp(self.low, self.high)
        else:
            actions = dist.logits.argmax(dim=1)
        return actions.cpu().numpy()


def saved_greedy_policy(
    learner: ActorCritic, saved: AgentCheckpoint
) -> list[Callable[[np.ndarray], np.ndarray]]:
    """``learner``'s greedy policy with the policy network of a saved ``checkpoint.pt``
    (``mode=eval`` of VPG and PPO)."""
    learner.policy.load_state_dict(saved["policy"])
    return [learner.greedy]
