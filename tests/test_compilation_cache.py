"""``backend.compilation_cache``: a run whose programs were compiled before loads them
from the cache instead of compiling, and learns exactly what the first run learned; and
the fused loop's chunks need one program per run where they can."""

from __future__ import annotations

import json
import os
import re

import pytest

from rlspeed.core.algos.loops.fused_training import chunk_length
from tests.conftest import run_cli, without_rates

FUSED_RUN = [
    "backend=flax", "env=jax-vmap", "algo=dqn", "task=cartpole", "num_envs=8",
    "total_steps=2048", "log_every=1024", "eval_every=2048", "algo.learning_starts=512",
    "algo.hidden_sizes=[32]", "algo.batch_size=32", "tracking=none", "progress=none",
]  # fmt: skip


FUSED_PPO_RUN = [
    "backend=flax", "env=jax-vmap", "algo=ppo", "task=cartpole", "num_envs=8",
    "total_steps=2048", "log_every=1024", "eval_every=2048", "algo.num_steps=64",
    "algo.hidden_sizes=[32]", "tracking=none", "progress=none",
]  # fmt: skip


def _run(
    tmp_path, name: str, *extra: str, env: dict[str, str] | None = None, base: list[str] = FUSED_RUN
):
    """The run's metrics.json and its log (Hydra sends log records to stdout)."""
    run_dir = tmp_path / name
    result = run_cli([*base, *extra, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_dir / "metrics.json").read_text()), result.stdout + result.stderr


@pytest.mark.slow
def test_second_run_loads_every_program_from_the_cache(tmp_path):
    cache = f"backend.compilation_cache={tmp_path / 'xla'}"
    first, _ = _run(tmp_path, "first", cache)
    # JAX logs each program it compiles, and whether it was loaded from the cache instead.
    second, log = _run(tmp_path, "second", cache, env={"JAX_LOG_COMPILES": "1"})
    compiled = re.findall(r"Finished XLA compilation of (\S+)", log)
    loaded = re.findall(r"Persistent compilation cache hit for '(\S+)'", log)
    assert "jit_run_chunk" in loaded and len(loaded) == len(compiled), (compiled, loaded)
    for key in ("score", "rolling_step_reward", "env_steps", "gradient_updates"):
        assert second[key] == first[key], key
    learned = without_rates(first["final"])
    assert learned and {k: second["final"][k] for k in learned} == learned


@pytest.mark.slow
@pytest.mark.parametrize(
    ("base", "changed"),
    [
        (FUSED_RUN, ["algo.learning_rate=1e-3", "algo.gamma=0.95", "algo.tau=0.5",
                 "algo.end_e=0.1", "algo.exploration_fraction=0.2"]),
        (FUSED_PPO_RUN, ["algo.learning_rate=1e-3", "algo.clip_coef=0.3", "algo.ent_coef=0.001",
                 "algo.vf_coef=0.25", "algo.gae_lambda=0.9", "algo.gamma=0.95"]),
    ],
)  # fmt: skip
def test_runs_differing_only_in_traced_hyperparameters_share_their_programs(
    tmp_path, base, changed
):
    """The values a search varies are inputs of the fused program, not constants in it: a
    second run with other values loads every program from the cache, and learns otherwise."""
    cache = f"backend.compilation_cache={tmp_path / 'xla'}"
    first, _ = _run(tmp_path, "first", cache, base=base)
    env = {"JAX_LOG_COMPILES": "1"}
    second, log = _run(tmp_path, "second", cache, *changed, env=env, base=base)
    compiled = re.findall(r"Finished XLA compilation of (\S+)", log)
    loaded = re.findall(r"Persistent compilation cache hit for '(\S+)'", log)
    assert "jit_run_chunk" in loaded and len(loaded) == len(compiled), (compiled, loaded)
    assert without_rates(second["final"]) != without_rates(first["final"])


@pytest.mark.slow
def test_default_cache_follows_xdg_cache_home_and_null_turns_it_off(tmp_path):
    home = tmp_path / "cache-home"
    _run(tmp_path, "default", env={"XDG_CACHE_HOME": str(home)})
    assert os.listdir(home / "rlspeed" / "xla")
    off = tmp_path / "off-home"
    _run(tmp_path, "off", "backend.compilation_cache=null", env={"XDG_CACHE_HOME": str(off)})
    assert not (off / "rlspeed").exists()


@pytest.mark.parametrize(
    ("target", "total", "masked", "chunk"),
    [
        (10, 100, False, 10),  # divides the run
        (10, 96, False, 8),  # 96 = 12 x 8: one program, logs a little more often
        (10, 97, False, 10),  # 97 is prime: a last chunk of 7 gets a program of its own
        (10, 97, True, 10),  # masked (XLA:CPU): one program runs the shorter last chunk too
        (500, 120, False, 120),  # a run shorter than one chunk
        (0, 5, False, 1),
    ],
)
def test_chunk_length_divides_the_run_where_a_last_chunk_costs_a_program(
    target, total, masked, chunk
):
    assert chunk_length(target, total, masked) == chunk
