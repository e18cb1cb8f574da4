"""``sacpqn``: SAC and PQN, whole processes, against CleanRL's scripts and rejax.

Each workload is one peer's program at its own settings and the ``rlspeed`` command with the
same hyperparameters, at equal env steps and gradient updates, on two stacks: torch +
gym-sync (the host loop) and flax + jax-vmap (fused):

- SAC on Pendulum-v1 (Gymnasium's; rlspeed's ``task=pendulum``) at the settings of CleanRL's
  ``cleanrl/sac_continuous_action.py`` (its defaults, the env and length given);
- SAC on gymnax's Pendulum-v1 (``task=gymnax``) at rejax's config (configs/gymnax/pendulum.yaml);
- PQN on CartPole-v1 (Gymnasium's; ``task=cartpole``) at CleanRL's ``cleanrl/pqn.py`` defaults;
- PQN on gymnax's CartPole-v1 at rejax's config (configs/gymnax/cartpole.yaml).

The rejax workloads need the gymnax extra; without it they are left out in one line. Timing,
turns and the table: ``rlspeed.bench.peers``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from rlspeed.bench.common import write_results
from rlspeed.bench.peers import (
    Peers,
    Side,
    Workload,
    config_lines,
    json_config,
    missing_peers,
    peer_table,
    peer_versions,
    plot_workloads,
    process_time_note,
    rlspeed_side,
    run_workloads,
    verdicts,
)

STACKS = {
    "rlspeed torch gym-sync": ["backend=torch", "env=gym-sync"],
    "rlspeed flax fused": ["backend=flax", "env=jax-vmap"],
}
NO_GYMNAX = (
    "the rejax workloads (task=gymnax) left out: rlspeed's side needs the gymnax extra"
    ' (pip install "rlspeed[gymnax]")'
)

# CleanRL's SAC defaults (Args of sac_continuous_action.py): every one given on the command
# line, so that the script's defaults changing shows here.
CLEANRL_SAC: dict[str, Any] = {
    "buffer-size": 1_000_000, "gamma": 0.99, "tau": 0.005, "batch-size": 256,
    "learning-starts": 5000, "policy-lr": 3e-4, "q-lr": 1e-3, "policy-frequency": 2,
    "target-network-frequency": 1, "alpha": 0.2,
}  # fmt: skip
# CleanRL's PQN defaults (Args of pqn.py).
CLEANRL_PQN: dict[str, Any] = {
    "num-envs": 4, "num-steps": 128, "num-minibatches": 4, "update-epochs": 4,
    "learning-rate": 2.5e-4, "gamma": 0.99, "start-e": 1.0, "end-e": 0.05,
    "exploration-fraction": 0.5, "max-grad-norm": 10.0, "q-lambda": 0.65,
}  # fmt: skip
# rejax's configs (github.com/keraJLi/rejax, configs/gymnax/pendulum.yaml and cartpole.yaml).
REJAX_SAC: dict[str, Any] = {
    "env": "Pendulum-v1", "agent_kwargs": {"activation": "swish"}, "num_envs": 1,
    "buffer_size": 10_000, "fill_buffer": 256, "batch_size": 256, "learning_rate": 0.01,
    "num_epochs": 1, "total_timesteps": 10_000, "gamma": 0.99, "polyak": 0.98,
    "target_entropy_ratio": None, "normalize_observations": True,
}  # fmt: skip
REJAX_PQN: dict[str, Any] = {
    "env": "CartPole-v1", "num_envs": 16, "num_steps": 128, "num_minibatches": 16,
    "max_grad_norm": 10, "learning_rate": 0.0003, "num_epochs": 5, "total_timesteps": 524_288,
    "eps_start": 1, "eps_end": 0.05, "exploration_fraction": 0.5, "gamma": 0.99,
    "td_lambda": 0.9, "normalize_observations": False,
}  # fmt: skip


def _flags(options: dict[str, Any]) -> list[str]:
    return [f"--{key}={value}" for key, value in options.items()]


def _stacks(base: list[str]) -> list[Side]:
    return [rlspeed_side(label, [*stack, *base]) for label, stack in STACKS.items()]


def _rejax(algo: str, config: dict[str, Any], total: int) -> tuple[str, ...]:
    # Evaluated once, at the end (its configs evaluate every 100 or 16,384 steps).
    config = {**config, "total_timesteps": total, "eval_freq": total}
    return (algo, "--config", json_config({**config, "skip_initial_evaluation": True}))


def workloads(quick: bool, gymnax: bool) -> list[Workload]:
    found = []
    # SAC, CleanRL: one env; updates from the step after learning_starts (global_step >
    # learning_starts, counting from 0): total - 5001 updates. rlspeed updates from
    # learning_starts on: 5001 makes the same count.
    total = 5_500 if quick else 20_000
    sac = CLEANRL_SAC
    found.append(
        Workload(
            "sac-pendulum-cleanrl",
            (
                Side(
                    "CleanRL sac_continuous_action.py",
                    "cleanrl",
                    (
                        "cleanrl/sac_continuous_action.py",
                        "--env-id=Pendulum-v1",
                        f"--total-timesteps={total}",
                        "--seed=1",
                        *_flags(sac),
                    ),
                    (total, total - sac["learning-starts"] - 1),
                ),  # fmt: skip
                *_stacks(
                    [
                        "algo=sac",
                        "task=pendulum",
                        "num_envs=1",
                        f"total_steps={total}",
                        f"eval_every={total}",
                        f"algo.buffer_size={sac['buffer-size']}",
                        f"algo.gamma={sac['gamma']}",
                        f"algo.tau={sac['tau']}",
                        f"algo.batch_size={sac['batch-size']}",
                        f"algo.learning_starts={sac['learning-starts'] + 1}",
                        f"algo.policy_lr={sac['policy-lr']}",
                        f"algo.q_lr={sac['q-lr']}",
                        f"algo.policy_frequency={sac['policy-frequency']}",
                        f"algo.alpha={sac['alpha']}",
                        "algo.autotune=true",
                        "algo.hidden_sizes=[256,256]",
                    ]
                ),  # fmt: skip
            ),
            f"CleanRL's SAC settings on Gymnasium's Pendulum-v1, {total} env steps, one env,"
            " 256x256 networks, a critic update per env step from step 5,001 on (rlspeed:"
            " learning_starts 5001, one more random step than CleanRL's 5,000), the policy"
            " updated twice every second step, alpha tuned; one evaluation at the end.",
        )
    )
    # PQN, CleanRL: 976 batches of 4 envs x 128 steps (500,000 // 512), 16 updates each.
    total = 20_480 if quick else 500_000
    batches = total // 512
    pqn = CLEANRL_PQN
    found.append(
        Workload(
            "pqn-cartpole-cleanrl",
            (
                Side(
                    "CleanRL pqn.py",
                    "cleanrl",
                    (
                        "cleanrl/pqn.py",
                        "--env-id=CartPole-v1",
                        f"--total-timesteps={total}",
                        "--seed=1",
                        *_flags(pqn),
                    ),
                    (batches * 512, batches * 16),
                ),  # fmt: skip
                *_stacks(
                    [
                        "algo=pqn",
                        "task=cartpole",
                        "num_envs=4",
                        f"total_steps={batches * 512}",
                        # Once, at the end (pqn.py evaluates never; the table's return is
                        # the last training episodes' on every side).
                        f"eval_every={batches * 512}",
                        "algo.num_steps=128",
                        "algo.num_minibatches=4",
                        "algo.update_epochs=4",
                        f"algo.learning_rate={pqn['learning-rate']}",
                        "algo.anneal_lr=true",
                        "algo.gamma=0.99",
                        "algo.start_e=1.0",
                        "algo.end_e=0.05",
                        "algo.exploration_fraction=0.5",
                        "algo.max_grad_norm=10.0",
                        f"algo.gae_lambda={pqn['q-lambda']}",
                        "algo.hidden_sizes=[120,84]",
                    ]
                ),  # fmt: skip
            ),
            f"CleanRL's pqn.py settings on Gymnasium's CartPole-v1: {batches} batches of 4 envs"
            " x 128 steps, 4 epochs of 4 minibatches, LayerNorm 120-84 network, lambda 0.65,"
            " epsilon 1 -> 0.05 over half the run, step size 2.5e-4 annealed. CleanRL steps"
            " with RAdam, rlspeed with Adam (eps 1e-5).",
        )
    )
    if not gymnax:
        return found
    # SAC, rejax: one env, updates once more than fill_buffer steps are in: total - 256.
    total = 2_000 if quick else int(REJAX_SAC["total_timesteps"])
    found.append(
        Workload(
            "sac-pendulum-rejax",
            (
                Side("rejax SAC", "rejax", _rejax("sac", REJAX_SAC, total), (total, total - 256)),
                *_stacks(
                    [
                        "algo=sac",
                        "task=gymnax",
                        "task.id=Pendulum-v1",
                        "num_envs=1",
                        f"total_steps={total}",
                        f"eval_every={total}",
                        "log_every=1000",
                        "algo.buffer_size=10000",
                        "algo.batch_size=256",
                        "algo.learning_starts=256",
                        "algo.q_lr=0.01",
                        "algo.policy_lr=0.01",
                        "algo.gamma=0.99",
                        "algo.tau=0.02",
                        "algo.policy_frequency=1",
                        "algo.autotune=true",
                        "algo.hidden_sizes=[64,64]",
                    ]
                ),  # fmt: skip
            ),
            f"rejax's SAC config on gymnax's Pendulum-v1, {total} env steps, one env, an update"
            " of critics, policy and alpha per env step past 256, step size 0.01, tau 0.02"
            " (polyak 0.98), 64x64 networks. rejax also normalises observations and uses"
            " swish; rlspeed's SAC does neither (ReLU, raw observations).",
        )
    )
    # PQN, rejax: 256 batches of 16 envs x 128 steps, 5 epochs of 16 minibatches.
    total = 16_384 if quick else int(REJAX_PQN["total_timesteps"])
    batches = total // 2048
    found.append(
        Workload(
            "pqn-cartpole-rejax",
            (
                Side(
                    "rejax PQN",
                    "rejax",
                    _rejax("pqn", REJAX_PQN, total),
                    (batches * 2048, batches * 80),
                ),
                *_stacks(
                    [
                        "algo=pqn",
                        "task=gymnax",
                        "task.id=CartPole-v1",
                        "num_envs=16",
                        f"total_steps={total}",
                        f"eval_every={total}",  # once, at the end, as rejax here
                        "algo.num_steps=128",
                        "algo.num_minibatches=16",
                        "algo.update_epochs=5",
                        "algo.learning_rate=0.0003",
                        "algo.anneal_lr=false",
                        "algo.gamma=0.99",
                        "algo.start_e=1.0",
                        "algo.end_e=0.05",
                        "algo.exploration_fraction=0.5",
                        "algo.max_grad_norm=10.0",
                        "algo.gae_lambda=0.9",
                        "algo.hidden_sizes=[64,64]",
                    ]
                ),  # fmt: skip
            ),
            f"rejax's PQN config on gymnax's CartPole-v1: {batches} batches of 16 envs x 128"
            " steps, 5 epochs of 16 minibatches, LayerNorm 64x64 network, lambda 0.9, step size"
            " 3e-4 constant. rejax clips each gradient element to +-10 (optax.clip) where"
            " rlspeed clips the global norm.",
        )
    )
    return found


def run(
    out_dir: Path,
    quick: bool,
    compose: Any,
    peers: Peers | None = None,
    repeats: int | None = None,
) -> list[Path]:
    peers = peers or Peers()
    gymnax = importlib.util.find_spec("gymnax") is not None
    chosen = workloads(quick, gymnax)
    left_out = missing_peers(peers, ("cleanrl", "rejax")) + ([] if gymnax else [NO_GYMNAX])
    for line in left_out:
        print(f"rlspeed-bench sacpqn: {line}", flush=True)
    repeats = repeats or (1 if quick else 5)
    outcomes, first = run_workloads(chosen, peers, repeats, quick)
    table = peer_table(
        "sacpqn",
        "SAC and PQN, whole processes: CleanRL and rejax against the rlspeed command",
        chosen,
        outcomes,
        first,
    )
    table.notes += [
        process_time_note("CleanRL's scripts write TensorBoard logs and print every episode."),
        f"The programs ran in turns, {repeats} time(s) each, forward then backward; medians."
        + (
            " Before them, one warm-up run each (first_run_s): rlspeed's first run fills its"
            " compilation cache; rejax compiles in every run."
            if not quick  # run_workloads warms up every full run, whatever --repeats
            else ""
        ),
        "return: rlspeed and CleanRL, the mean of the last 20 training episodes; rejax, the"
        " mean of its evaluation at the end (128 episodes). wall_vs_reference: against the"
        " workload's peer.",
        *left_out,
        *verdicts(table, {"rlspeed flax fused": ("CleanRL", 0.6)}),
        *verdicts(table, {"rlspeed flax fused": ("rejax", 0.6)}),
        *verdicts(table, {"rlspeed torch": ("CleanRL", 1.0)}),
    ]
    table.notes += peer_versions(peers, ("cleanrl", "rejax"))
    table.configs += config_lines(chosen, peers)
    return write_results(table, out_dir, plot_workloads)
