"""``jaxenvs``: gymnax envs on rlspeed's JAX engine, and PPO on them against PureJaxRL and
rejax. Two tables:

- ``jaxenvs_rates``: env steps/s against num_envs of gymnax's CartPole-v1 and
  Breakout-MinAtar (``task=gymnax``) stepped by gym-sync (the twin's Gymnasium face),
  jax-vmap and jax-fused, as ``envs`` measures its tasks (``rlspeed.bench.envs``).
- ``jaxenvs_ppo``: whole processes of PPO, PureJaxRL's ``purejaxrl/ppo.py`` (its config,
  CartPole-v1, 1 and 16 seeds) and rejax's PPO (its CartPole-v1 config, 1 and 16 seeds;
  its Breakout-MinAtar config, 1M steps, which PureJaxRL's script runs too), each against
  the ``rlspeed`` command (flax + jax-vmap, fused) with the same hyperparameters, at equal
  env steps and gradient updates (``rlspeed.bench.peers``).

Needs the gymnax extra (``pip install "rlspeed[gymnax]"``); the peers are optional.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, write_results
from rlspeed.bench.envs import COLUMNS as RATE_COLUMNS
from rlspeed.bench.envs import plot_rates, rates_table
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
    rlspeed_side,
    run_workloads,
    verdicts,
)

NEEDS_GYMNAX = (
    'rlspeed-bench jaxenvs needs the gymnax extra (pip install "rlspeed[gymnax]"):'
    " its env rates and its rlspeed runs are of task=gymnax"
)
TASKS = {
    "CartPole-v1": ["task=gymnax", "task.id=CartPole-v1"],
    "Breakout-MinAtar": ["task=gymnax", "task.id=Breakout-MinAtar"],
}
# The env rates compose the task without rlspeed's checks, which fill in task.max_steps (null:
# the env's own episode limit): here it is given, as gymnax's defaults have it.
RATE_TASKS = {
    "CartPole-v1": [*TASKS["CartPole-v1"], "task.max_steps=500"],
    "Breakout-MinAtar": [*TASKS["Breakout-MinAtar"], "task.max_steps=1000"],
}
RATE_MODES = ("gym-sync", "jax-vmap", "jax-fused")
FUSED = ["backend=flax", "env=jax-vmap"]
FUSED_LABEL = "rlspeed flax fused"


def gymnax_problem() -> str | None:
    """One line when gymnax is not installed."""
    return None if importlib.util.find_spec("gymnax") else NEEDS_GYMNAX


# PureJaxRL's config in the ``__main__`` of purejaxrl/ppo.py, DEBUG (a host callback that
# prints every episode) off as in its README's examples, which time make_train's program.
PUREJAXRL_PPO: dict[str, Any] = {
    "LR": 2.5e-4,
    "NUM_ENVS": 4,
    "NUM_STEPS": 128,
    "TOTAL_TIMESTEPS": 5e5,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True,
    "DEBUG": False,
}
# rejax's PPO configs: configs/gymnax/cartpole.yaml and benchmark/breakout_1m.yaml of
# github.com/keraJLi/rejax. eval_freq is set per run (see _rejax_config).
REJAX_PPO_CARTPOLE: dict[str, Any] = {
    "env": "CartPole-v1",
    "agent_kwargs": {"activation": "tanh"},
    "num_envs": 5,
    "num_steps": 100,
    "num_epochs": 5,
    "num_minibatches": 5,
    "learning_rate": 0.00075,
    "max_grad_norm": 0.5,
    "total_timesteps": 100_000,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_eps": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
}
REJAX_PPO_BREAKOUT: dict[str, Any] = {
    "env": "Breakout-MinAtar",
    "agent_kwargs": {"activation": "tanh"},
    "num_envs": 32,
    "num_steps": 32,
    "num_epochs": 4,
    "num_minibatches": 4,
    "learning_rate": 0.00025674088686342003,
    "max_grad_norm": 1,
    # breakout_1m.yaml's 1,000,000 rounded down to whole batches of 1024, so that every
    # program runs the same 976 batches (rejax rounds up per evaluation, PureJaxRL down).
    "total_timesteps": 999_424,
    "gamma": 0.995,
    "gae_lambda": 0.95,
    "clip_eps": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
}


def _ppo_overrides(
    task: str,
    num_envs: int,
    total: int,
    num_steps: int,
    epochs: int,
    minibatches: int,
    learning_rate: float,
    anneal: bool,
    max_grad_norm: float,
    gamma: float,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The rlspeed command's overrides for a PPO config (64x64 tanh networks, GAE lambda
    0.95, clip 0.2 on the ratio and the value, entropy 0.01, value 0.5, normalised
    advantages: what all three programs share)."""
    return [
        *TASKS[task], "algo=ppo", *FUSED, f"num_envs={num_envs}", f"total_steps={total}",
        f"algo.num_steps={num_steps}", f"algo.update_epochs={epochs}",
        f"algo.num_minibatches={minibatches}", f"algo.learning_rate={learning_rate}",
        f"algo.anneal_lr={str(anneal).lower()}", f"algo.max_grad_norm={max_grad_norm}",
        f"algo.gamma={gamma}", "algo.gae_lambda=0.95", "algo.clip_coef=0.2",
        "algo.clip_vloss=true", "algo.ent_coef=0.01", "algo.vf_coef=0.5",
        "algo.normalize_advantages=true", "algo.hidden_sizes=[64,64]", *extra,
    ]  # fmt: skip


def _batches(total: int, batch: int) -> int:
    return total // batch


def _rejax_config(config: dict[str, Any], total: int) -> dict[str, Any]:
    """rejax's config for ``total`` steps, evaluated once, at the end (its configs evaluate
    every 1,000 or 50,000 steps on 128 episodes; rlspeed's default is every 50,000 on 10)."""
    return {**config, "total_timesteps": total, "eval_freq": total, "skip_initial_evaluation": True}


def workloads(quick: bool) -> list[Workload]:
    found = []
    # PureJaxRL's CartPole config: 976 batches of 4 envs x 128 steps (5e5 // 512).
    pjx_total = 20_480 if quick else int(PUREJAXRL_PPO["TOTAL_TIMESTEPS"])
    pjx_batches = _batches(pjx_total, 512)
    pjx_overrides = _ppo_overrides(
        "CartPole-v1", 4, pjx_batches * 512, 128, 4, 4, 2.5e-4, True, 0.5, 0.99,
        ("algo.orthogonal_init=true",),
    )  # fmt: skip
    pjx_config = {**PUREJAXRL_PPO, "TOTAL_TIMESTEPS": pjx_total}
    for seeds in (1, 16):
        plural = "s" if seeds > 1 else ""
        work = (seeds * pjx_batches * 512, seeds * pjx_batches * 16)
        args = ("purejaxrl/ppo.py", "--config", json_config(pjx_config), "--seeds", str(seeds))
        found.append(
            Workload(
                f"ppo-cartpole-purejaxrl-{seeds}-seed{plural}",
                (
                    Side("PureJaxRL ppo.py", "purejaxrl", args, work, seeds),
                    rlspeed_side(FUSED_LABEL, [*pjx_overrides, f"num_seeds={seeds}"], seeds),
                ),
                f"PureJaxRL's ppo.py config (gymnax CartPole-v1), {seeds} seed{plural}:"
                f" {pjx_batches} batches of 4 envs x 128 steps, 4 epochs of 4 minibatches,"
                " step size 2.5e-4 annealed, orthogonal init on both sides.",
            )
        )
    # rejax's CartPole config: 200 batches of 5 envs x 100 steps.
    rjx_total = 10_000 if quick else 100_000
    rjx_config = _rejax_config(REJAX_PPO_CARTPOLE, rjx_total)
    rjx_overrides = _ppo_overrides(
        "CartPole-v1", 5, rjx_total, 100, 5, 5, 0.00075, False, 0.5, 0.99
    )
    for seeds in (1, 16):
        plural = "s" if seeds > 1 else ""
        batches = _batches(rjx_total, 500)
        work = (seeds * batches * 500, seeds * batches * 25)
        args = ("ppo", "--config", json_config(rjx_config), "--seeds", str(seeds))
        found.append(
            Workload(
                f"ppo-cartpole-rejax-{seeds}-seed{plural}",
                (
                    Side("rejax PPO", "rejax", args, work, seeds),
                    rlspeed_side(FUSED_LABEL, [*rjx_overrides, f"num_seeds={seeds}"], seeds),
                ),
                f"rejax's CartPole-v1 PPO config, {seeds} seed{plural}: {batches} batches of"
                " 5 envs x 100 steps, 5 epochs of 5 minibatches, step size 7.5e-4 constant."
                " rejax clips each gradient element to +-0.5 (optax.clip) where rlspeed"
                " clips the global norm, and steps actor and critic with two Adams.",
            )
        )
    # Breakout-MinAtar at rejax's 1M-step config: 976 batches of 32 envs x 32 steps.
    brk_total = 32_768 if quick else int(REJAX_PPO_BREAKOUT["total_timesteps"])
    batches = _batches(brk_total, 1024)
    work = (batches * 1024, batches * 16)
    brk = REJAX_PPO_BREAKOUT
    brk_pjx = {
        **PUREJAXRL_PPO,
        "ENV_NAME": "Breakout-MinAtar",
        "LR": brk["learning_rate"],
        "NUM_ENVS": 32,
        "NUM_STEPS": 32,
        "TOTAL_TIMESTEPS": brk_total,
        "MAX_GRAD_NORM": 1.0,
        "GAMMA": 0.995,
        "ANNEAL_LR": False,
    }
    brk_lr = float(brk["learning_rate"])
    # The peers' MLP on the flattened frames, not the conv torso rlspeed picks for images.
    brk_overrides = _ppo_overrides(
        "Breakout-MinAtar", 32, brk_total, 32, 4, 4, brk_lr, False, 1.0, 0.995,
        ("algo.network=mlp",),
    )  # fmt: skip
    found.append(
        Workload(
            "ppo-breakout-minatar",
            (
                Side(
                    "rejax PPO",
                    "rejax",
                    ("ppo", "--config", json_config(_rejax_config(brk, brk_total))),
                    work,
                ),
                Side(
                    "PureJaxRL ppo.py",
                    "purejaxrl",
                    ("purejaxrl/ppo.py", "--config", json_config(brk_pjx)),
                    work,
                ),
                rlspeed_side(FUSED_LABEL, brk_overrides),
            ),
            f"rejax's Breakout-MinAtar PPO config (benchmark/breakout_1m.yaml), {batches}"
            " batches of 32 envs x 32 steps, 4 epochs of 4 minibatches, a 64x64 tanh MLP on"
            " the flattened 10x10x4 observation; PureJaxRL's ppo.py (which has no MinAtar"
            " config of its own) runs the same config.",
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
    counts = (1, 8) if quick else (1, 16, 256, 4096, 16384)
    budget_s = 0.05 if quick else 1.5
    rates = Table(
        "jaxenvs_rates",
        "gymnax envs on rlspeed (task=gymnax): env steps/s against num_envs (random actions)",
        RATE_COLUMNS,
        notes=[
            "gym-sync steps the twin's Gymnasium face (one env's jitted step per env and"
            " call) and stops at 256 envs; jax-vmap calls the jitted vmapped step once per"
            " vector step from Python; jax-fused runs it inside one jitted lax.scan (compile"
            " time excluded).",
            f"Each figure: at least {budget_s} s of stepping after one warm-up call.",
        ],
    )
    limits = {"gym-sync": 256}
    rates_table(rates, compose, RATE_MODES, counts, budget_s, limits, tuple(TASKS), RATE_TASKS)
    paths = write_results(rates, out_dir, plot_rates)

    chosen = workloads(quick)
    left_out = missing_peers(peers, ("purejaxrl", "rejax"))
    for line in left_out:
        print(f"rlspeed-bench jaxenvs: {line}", flush=True)
    repeats = repeats or (1 if quick else 5)
    outcomes, first = run_workloads(chosen, peers, repeats, quick)
    table = peer_table(
        "jaxenvs_ppo",
        "PPO on gymnax envs, whole processes: PureJaxRL and rejax against the rlspeed command",
        chosen,
        outcomes,
        first,
    )
    table.notes += [
        "Process time: from starting the process to its exit (interpreter start, imports,"
        " tracing, compiling, training; for rlspeed also its evaluations, MLflow tracking"
        " (the default, a local sqlite store), checkpoint and outputs).",
        f"The programs ran in turns, {repeats} time(s) each, forward then backward; medians."
        + (
            " Before them, one warm-up run each (first_run_s): rlspeed's first run compiles"
            " into an empty compilation cache and creates the MLflow store, later runs load"
            " its programs, as a user's next run of the command does. PureJaxRL and rejax"
            " have no compilation cache: they compile in every run."
            if not quick  # run_workloads warms up every full run, whatever --repeats
            else ""
        ),
        "return: rlspeed and PureJaxRL, the mean of the last 20 training episodes (per seed,"
        " then the mean over seeds); rejax, the mean of its evaluation at the end (128"
        " episodes per seed). wall_vs_reference: against the workload's first program.",
        "The peers' env steps and updates follow from their configs as their loops count"
        " them; rlspeed's are what its run reported (same_work compares them).",
        *left_out,
        *verdicts(table, {FUSED_LABEL: ("rejax", 0.6)}),
        *verdicts(table, {FUSED_LABEL: ("PureJaxRL", 0.6)}),
    ]
    table.notes += peer_versions(peers, ("purejaxrl", "rejax"))
    table.configs += config_lines(chosen, peers)
    return paths + write_results(table, out_dir, plot_workloads)
