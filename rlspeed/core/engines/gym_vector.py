"""Gymnasium vector envs (sync or async) behind the common engine interface."""

from __future__ import annotations

import contextlib
import os
import signal
import warnings
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from rlspeed.core.engines import StepResult
from rlspeed.core.engines.env_state import GET_STATE, SAVED_STATE, SET_STATE, with_state_access
from rlspeed.errors import EnvCode
from rlspeed.seeding import env_seeds

if TYPE_CHECKING:
    from rlspeed.config import EngineConfig, TaskConfig
    from rlspeed.core import AnyArray
    from rlspeed.core.tasks import TaskSpec


class GymVectorEngine:
    """Wraps a Gymnasium vector env that resets finished envs in the same step."""

    def __init__(
        self,
        vector_env: gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv,
        seed: int,
        name: str = "env",
        step_timeout_s: float | None = None,
    ) -> None:
        self.envs = vector_env
        self.seed = seed
        # gym-async: how long a step may take before the env is taken to hang (None: sync).
        self.step_timeout_s = step_timeout_s
        # How the failures of the env's own code name it (its Gymnasium id, or its task).
        self.name = name
        self._failed = False  # a call into the envs failed: they are not to be called again
        self._stepping = self._env_code("step")  # entered every step: made once
        self.num_envs = vector_env.num_envs
        self.single_observation_space = vector_env.single_observation_space
        self.single_action_space = vector_env.single_action_space
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)

    def reset(self) -> np.ndarray:
        # Env i's own stream of the run's seed (not seed + i, which seed + 1's env i - 1 shares).
        seeds: list[int | None] = [*env_seeds(self.seed, self.num_envs)]  # reset's list type
        obs: np.ndarray
        with self._env_code("reset"):
            obs, _ = self.envs.reset(seed=seeds)
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        return obs

    def step(self, actions: AnyArray) -> StepResult:
        # np.asarray shares memory with CPU torch tensors and JAX arrays (no copy).
        with self._stepping:
            if self.step_timeout_s is None:
                result = self.envs.step(np.asarray(actions))
            else:  # a worker that does not answer holds an env that hangs
                assert isinstance(self.envs, gym.vector.AsyncVectorEnv)
                self.envs.step_async(np.asarray(actions))
                result = self.envs.step_wait(timeout=self.step_timeout_s)
        obs, reward, terminated, truncated, info = result
        # New arrays each step, never written in place: a StepResult keeps its own.
        episode_return, episode_length = self._returns + reward, self._lengths + 1
        self._returns, self._lengths = episode_return, episode_length
        final_obs = obs
        done = terminated | truncated
        if done.any():
            final_obs = obs.copy()
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = info["final_obs"][i]
            self._returns = np.where(done, 0.0, episode_return)
            self._lengths = np.where(done, 0, episode_length)
        return StepResult(
            obs,
            reward.astype(np.float32),
            terminated,
            truncated,
            final_obs,
            episode_return,
            episode_length,
        )

    def state_dict(self) -> dict[str, Any]:
        """Each env's state (``rlspeed.core.engines.env_state``), taken where it runs (the worker
        processes on gym-async), and the returns and lengths of the episodes so far."""
        envs = list(self.envs.call(GET_STATE))
        return {"envs": envs, "returns": self._returns.copy(), "lengths": self._lengths.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.envs.set_attr(SAVED_STATE, list(state["envs"]))  # each env's its own
        self.envs.call(SET_STATE)
        self._returns = np.array(state["returns"], dtype=np.float64)
        self._lengths = np.array(state["lengths"], dtype=np.int64)

    def close(self) -> None:
        if not self._failed:
            with self._env_code("close"):
                self.envs.close()
            return
        # After a failed call, a gym-async env may wait for an answer from a worker that is
        # gone or hangs: its workers are killed (they ignore SIGTERM, which the main process
        # handles for them), and it is marked closed (its __del__ would try again).
        for process in getattr(self.envs, "processes", []):
            process.kill()
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.envs.close(terminate=True)
        self.envs.closed = True

    def _env_code(self, call: str) -> EnvCode:
        """Around a call into the envs' own code (``rlspeed.errors.EnvCode``); a failed
        call leaves the envs not to be called again."""
        workers = isinstance(self.envs, gym.vector.AsyncVectorEnv)
        return EnvCode(self.name, call, workers, failed=self._fail)

    def _fail(self) -> None:
        self._failed = True


def _make_env(
    make_env: Callable[[TaskConfig], gym.Env], task_cfg: TaskConfig, main_pid: int
) -> gym.Env:
    """One env copy. In a gym-async worker, the stop signals that a terminal or a scheduler
    sends every process of the job (Ctrl-C, SIGTERM, SIGUSR2) are ignored: the main process
    stops at the end of an iteration, takes the envs' state from the workers, then closes
    them (a worker stopped by the signal would take its env's state with it)."""
    if os.getpid() != main_pid:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_IGN)
    return with_state_access(make_env(task_cfg))


def make_vector_engine(
    task: TaskSpec,
    task_cfg: TaskConfig,
    engine_cfg: EngineConfig,
    num_envs: int,
    seed: int,
    asynchronous: bool,
) -> GymVectorEngine:
    # The task's make_env alone goes to the workers: with spawn, what they get is pickled.
    env_fns = [partial(_make_env, task.make_env, task_cfg, os.getpid())] * num_envs
    if asynchronous:
        envs: gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv = gym.vector.AsyncVectorEnv(
            env_fns,
            shared_memory=engine_cfg.shared_memory,
            autoreset_mode=AutoresetMode.SAME_STEP,
            context="spawn" if task.env_runs_jax else None,
        )
    else:
        envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
    name = str(getattr(task_cfg, "id", None) or task.name)
    timeout = engine_cfg.step_timeout_s if asynchronous else None
    return GymVectorEngine(envs, seed, name, timeout)
