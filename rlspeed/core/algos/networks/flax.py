"""The shared MLP in Flax (observations, one-hot encoded where categorical or through the
conv torso where images -> MLP), and the stochastic actor-critic of the on-policy algorithms
(VPG, PPO) as pure functions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rlspeed.core.algos.encoding import one_hot_classes, through_torso
from rlspeed.core.algos.networks import (
    CONV_CHANNELS,
    CONV_KERNEL,
    HIDDEN_GAIN,
    LAYER_NORM_EPSILON,
    POLICY_GAIN,
    VALUE_GAIN,
    ActorCriticSettings,
)

if TYPE_CHECKING:
    from flax.typing import VariableDict
    from gymnasium import spaces

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def example_observations(obs_space: spaces.Space[Any]) -> jax.Array:
    """One all-zero observation [1, ...] to initialise a network with, in the dtype JAX
    computes it in (a Discrete space's int64 is int32 without x64: asking for int64 warned
    at every start)."""
    # Never None: gymnasium types every space's shape as optional, for the spaces without
    # one (Dict, Tuple), which no algorithm takes.
    shape = cast("tuple[int, ...]", obs_space.shape)
    return jnp.zeros((1, *shape), dtype=jax.dtypes.canonicalize_dtype(obs_space.dtype))


def apply_output(module: nn.Module, params: VariableDict, *inputs: jax.Array) -> jax.Array:
    """``module.apply(params, *inputs)`` of a module that returns one array. Without
    ``mutable``, ``apply`` returns the module's output alone; flax's annotation also admits
    the (output, updated variables) pair it returns with ``mutable``."""
    return module.apply(params, *inputs)  # type: ignore[return-value]


class UnpaddedConv(nn.Module):
    """``nn.Conv(features, (CONV_KERNEL, CONV_KERNEL), padding="VALID")`` as one matrix
    product over the image's patches: the same parameters (kernel [k, k, in, out], bias) and
    outputs. On the CPU XLA's convolution ran fused PPO on Breakout-MinAtar at 1.2 k env
    steps/s, this product at 7 k."""

    features: int
    kernel_init: nn.initializers.Initializer

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        size = CONV_KERNEL
        shape = (size, size, x.shape[-1], self.features)
        kernel = self.param("kernel", self.kernel_init, shape)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        height, width = x.shape[-3] - size + 1, x.shape[-2] - size + 1
        # Each position's patch in the kernel's (row, column, channel) order.
        shifts = [
            x[..., i : i + height, j : j + width, :] for i in range(size) for j in range(size)
        ]
        patches = jnp.concatenate(shifts, axis=-1)
        out: jax.Array = patches @ kernel.reshape(-1, self.features) + bias
        return out


class MLP(nn.Module):
    """Observations -> ``activation`` after each hidden layer -> ``out_size`` outputs.
    ``output_gain``: orthogonal weights (``HIDDEN_GAIN`` in the hidden layers and the conv
    torso, this gain on the output; biases 0) instead of flax's default LeCun normal.
    ``layer_norm``: a LayerNorm between each hidden layer and its activation (PQN).
    ``torso``: image observations [B, H, W, C] go through the conv torso (``CONV_CHANNELS``,
    each conv followed by a ReLU) into the first hidden layer
    (``rlspeed.core.algos.encoding.through_torso``); uint8 images (camera frames) are
    scaled to [0, 1]."""

    out_size: int
    hidden_sizes: Sequence[int]
    classes: int  # one-hot classes per observation entry, 0 for continuous
    activation: Callable[[jax.Array], jax.Array] = nn.tanh
    output_gain: float | None = None
    layer_norm: bool = False
    torso: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        batch = obs.shape[0]
        orthogonal = self.output_gain is not None

        def kernel_init(gain: float | None) -> nn.initializers.Initializer:
            if not orthogonal or gain is None:
                return nn.linear.default_kernel_init  # LeCun normal
            return nn.initializers.orthogonal(gain)

        def dense(size: int, gain: float | None) -> nn.Dense:
            return nn.Dense(size, kernel_init=kernel_init(gain))

        if self.torso:
            x = obs.astype(jnp.float32)
            if obs.dtype == jnp.uint8:
                x = x / 255.0
            for i, channels in enumerate(CONV_CHANNELS):
                conv = UnpaddedConv(channels, kernel_init(HIDDEN_GAIN), name=f"Conv_{i}")
                x = nn.relu(conv(x))
            x = x.reshape(batch, -1)
        elif self.classes:
            x = jax.nn.one_hot(obs, self.classes).reshape(batch, -1)
        else:
            x = obs.reshape(batch, -1).astype(jnp.float32)

        for size in self.hidden_sizes:
            x = dense(size, HIDDEN_GAIN)(x)
            if self.layer_norm:
                x = nn.LayerNorm(epsilon=LAYER_NORM_EPSILON)(x)
            x = self.activation(x)
        return dense(self.out_size, self.output_gain)(x)


class Policy(nn.Module):
    """Logits of a categorical (``initial_log_std`` None), or the mean and the learned,
    state-independent log std of a diagonal Gaussian."""

    out_size: int
    hidden_sizes: Sequence[int]
    classes: int
    initial_log_std: float | None
    output_gain: float | None = None
    torso: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        out = MLP(
            self.out_size,
            self.hidden_sizes,
            self.classes,
            output_gain=self.output_gain,
            torso=self.torso,
        )(obs)
        if self.initial_log_std is None:
            return out, None
        init = nn.initializers.constant(self.initial_log_std)
        return out, self.param("log_std", init, (self.out_size,))


class ActorCritic:
    """Pure functions of an on-policy learner's policy and value networks
    (``algo.hidden_sizes``, ``algo.initial_log_std``): their parameters, acting, values,
    log-probabilities; the algorithm adds its optimizers and update. ``orthogonal``:
    orthogonal init (see ``MLP``)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        action_space: spaces.Box | spaces.Discrete,
        algo: ActorCriticSettings,
        orthogonal: bool = False,
    ) -> None:
        self.continuous = bool(action_space.shape)
        classes = one_hot_classes(obs_space)
        hidden = tuple(algo.hidden_sizes)
        # A Box where the actions are continuous (they have a shape), else a Discrete.
        if self.continuous:
            box = cast("spaces.Box", action_space)
            out_size = int(np.prod(box.shape))
            self.low, self.high = jnp.asarray(box.low), jnp.asarray(box.high)
        else:
            out_size = int(cast("spaces.Discrete", action_space).n)
        log_std = float(algo.initial_log_std) if self.continuous else None
        policy_gain, value_gain = (POLICY_GAIN, VALUE_GAIN) if orthogonal else (None, None)
        torso = through_torso(obs_space, algo.network)
        self.policy = Policy(out_size, hidden, classes, log_std, policy_gain, torso)
        self.value = MLP(1, hidden, classes, output_gain=value_gain, torso=torso)
        self._dummy_obs = example_observations(obs_space)

    def init_params(self, key: jax.Array) -> tuple[VariableDict, VariableDict]:
        """(policy parameters, value parameters)."""
        policy_key, value_key = jax.random.split(key)
        return (
            self.policy.init(policy_key, self._dummy_obs),
            self.value.init(value_key, self._dummy_obs),
        )

    def _policy_outputs(
        self, params: VariableDict, obs: jax.Array
    ) -> tuple[jax.Array, jax.Array | None]:
        """The policy's (logits or mean, log std: None for a categorical)."""
        # Without ``mutable``, flax's ``apply`` returns the output alone (see apply_output).
        return self.policy.apply(params, obs)  # type: ignore[return-value]

    def act(
        self, params: VariableDict, obs: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sampled actions: (as sampled, as sent to the env: clipped to the bounds, their
        log-probabilities)."""
        out, log_std = self._policy_outputs(params, obs)
        if self.continuous:
            assert log_std is not None  # a Gaussian policy: its log std is a parameter
            actions = out + jnp.exp(log_std) * jax.random.normal(key, out.shape)
            env_actions = jnp.clip(actions, self.low, self.high)
        else:
            actions = env_actions = jax.random.categorical(key, out).astype(jnp.int32)
        return actions, env_actions, self._log_prob_entropy(out, log_std, actions)[0]

    def greedy(self, params: VariableDict, obs: jax.Array) -> jax.Array:
        out, _ = self._policy_outputs(params, obs)
        if self.continuous:
            return jnp.clip(out, self.low, self.high)
        return out.argmax(axis=1)

    def values(self, params: VariableDict, obs: jax.Array) -> jax.Array:
        return apply_output(self.value, params, obs)[:, 0]

    def log_prob_entropy(
        self, params: VariableDict, obs: jax.Array, actions: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Log-probabilities of ``actions`` [B] and the policy's entropy at each obs [B]
        (a loss weighs them: the masked samples of a run's last batch count for nothing)."""
        return self._log_prob_entropy(*self._policy_outputs(params, obs), actions)

    def _log_prob_entropy(
        self, out: jax.Array, log_std: jax.Array | None, actions: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        if self.continuous:
            assert log_std is not None  # a Gaussian policy: its log std is a parameter
            z = (actions - out) * jnp.exp(-log_std)
            log_prob = jnp.sum(-0.5 * z**2 - log_std - LOG_SQRT_2PI, axis=-1)
            # A state-independent std: the same entropy at every observation.
            entropy = jnp.sum(log_std + 0.5 + LOG_SQRT_2PI)
            return log_prob, jnp.broadcast_to(entropy, log_prob.shape)
        log_probs = jax.nn.log_softmax(out)
        log_prob = jnp.take_along_axis(log_probs, actions.astype(jnp.int32)[:, None], axis=1)
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=1)
        return log_prob[:, 0], entropy
