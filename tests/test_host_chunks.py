"""The host loop hands the run chunks of iterations, not one each (a one-env run recorded
and checkpointed every env step), yet every step the run acts at is a chunk's end: each log,
each multiple of the checkpoint and video periods (``marks``), the last step."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlspeed.core.algos.loops.host import CHUNK_ITERATIONS, HostTraining, Iteration
from rlspeed.core.engines.env_state import with_state_access
from rlspeed.core.engines.gym_vector import GymVectorEngine


class PushLeft:
    """A learner that always pushes the cart left, counts its steps as updates and the
    episodes that ended."""

    ended = 0

    def iteration(self, engine: Any, obs: Any, step: int, episodes: Any) -> Iteration:
        result = engine.step(np.zeros(engine.num_envs, np.int64))
        ended = result.terminated | result.truncated
        self.ended += int(ended.sum())
        if ended.any():
            episodes.episodes(ended, result.episode_return, result.episode_length)
        return Iteration(result.obs, engine.num_envs, 1, [{"losses/steps": float(step)}])

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def agent_checkpoint(self) -> dict[str, Any]:
        return {}


def test_chunks_end_at_every_log_mark_and_the_last_step_and_hold_every_episode():
    envs = gym.vector.SyncVectorEnv(
        [lambda: with_state_access(gym.make("CartPole-v1"))],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    learner = PushLeft()
    training = HostTraining(
        learner, GymVectorEngine(envs, seed=0), 1_000, log_every=300, marks=[70, 250]
    )
    ends, logged, episodes = [0], [], 0
    for chunk in training.chunks():
        assert chunk.updates == chunk.step  # one update per iteration, all counted
        ends.append(chunk.step)
        if chunk.metrics is not None:
            logged.append(chunk.step)
        episodes += sum(int(np.sum(batch.done)) for batch in chunk.episodes)
        training.accept()
    marked = {step for step in range(1, 1_001) if step % 70 == 0 or step % 250 == 0}
    assert marked | {300, 600, 900, 1_000} <= set(ends)
    assert logged == [300, 600, 900, 1_000]
    assert max(np.diff(ends)) <= CHUNK_ITERATIONS
    assert len(ends) - 1 < 1_000 / 2  # chunks, not iterations
    # Pushing left ends an episode about every 9 steps: none lost between chunks.
    assert episodes == learner.ended > 1_000 / 20
