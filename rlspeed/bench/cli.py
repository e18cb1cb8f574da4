"""``rlspeed-bench``: run benchmarks by name, each into ``OUT/<name>.{csv,md,png}``."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlspeed.cli import CONF_DIR
from rlspeed.config_tree import register_configs

# name -> what it measures (each is rlspeed.bench.<name> with run(out_dir, quick, compose)).
BENCHMARKS = {
    "envs": "env steps/s against num_envs: gym-sync, gym-async, jax-vmap, jax-fused",
    "mjx": "HalfCheetah env steps/s against num_envs: MuJoCo (gym-sync, gym-async) against"
    " MJX (jax-vmap, jax-fused)",
    "table2": "DQN on Doors, four stacks at equal env steps (the seed's Table 2)",
    "qlearn": "agent-steps/s of 1, 30 and 1024 tabular Q-learning agents in one program",
    "cartpole": "DQN on CartPole per stack: env steps/s and the return reached",
    "updates": "one TD3, VPG and DQN update step, flax against torch, across batch sizes",
    "overhead": "whole processes: default tracking against none (PPO and DQN fused, PPO with"
    " 16 seeds: time outside the compiled calls)",
    "torchloop": "whole processes: torch + gym-sync DQN on CartPole and Doors against a plain"
    " script, with 1 thread and with every core",
    "sweep": "whole Optuna sweeps (qlearn_search, ppo_float_search) on the fused path with"
    " hydra.sweeper.batch_size 1, 8 and 16: trials per hour, best value, lane against lone run",
    "searches": "every shipped search space (conf/hparams) against the default run of its"
    " algo and task: default score and wall time, best trial and sweep wall time, their ratio",
    "devices": "a fused run's lanes over 1, 2 and 4 devices (backend.devices; forced CPU"
    " devices where there is no GPU): lanes/s and env steps/s against the lanes, PPO CartPole",
    "threads": "torch on a shared machine: TD3 Hopper and DQN CartPole updates/s quiet and"
    " beside a busy process, 1 thread and one per core; with --cleanrl, torch DQN against"
    " CleanRL's dqn.py (whole processes)",
}
# Benchmarks that need an extra installed (``all`` runs them where it is).
EXTRAS = {
    "dmc": "PPO on MuJoCo Playground's DM Control suite, fused, whole runs: greedy score"
    " against a random policy's return, whole-process time (needs the playground extra)",
}
# Sized for one accelerator (8 minutes there): run by name, not by `all`.
ACCELERATOR = {
    "gpu": "env steps/s up to 131,072 envs, DQN on Doors torch against flax, PPO on"
    " CartPole with 1 and 16 seeds; JAX on the accelerator (docs/benchmarks/gpu)",
}
# Benchmarks of programs outside rlspeed: purejaxrl given with --script, the others with the
# peer options (--purejaxrl, --rejax, --cleanrl); `all` runs them only when those are given.
EXTERNAL = {
    "purejaxrl": "whole processes: PureJaxRL's DQN script (--script, --python) against the"
    " rlspeed command with its CartPole hyperparameters",
    "jaxenvs": "gymnax CartPole-v1 and Breakout-MinAtar: env steps/s against num_envs on"
    " task=gymnax, and PPO whole processes against PureJaxRL's ppo.py and rejax (--purejaxrl,"
    " --rejax; needs the gymnax extra)",
    "sacpqn": "whole processes: SAC and PQN against CleanRL's scripts and rejax (--cleanrl,"
    " --rejax), rlspeed on torch + gym-sync and flax fused",
}
# The benchmarks that take the peer options.
PEER_BENCHMARKS = ("jaxenvs", "sacpqn", "threads")
# Benchmarks of this checkout against an earlier git revision (--rev; not run by `all`).
REVISIONS = {
    "against": "whole processes: this checkout against --rev (default origin/main, else"
    " HEAD~1) in interleaved pairs: DQN and PPO on CartPole per stack, the default rlspeed,"
    " PPO with 16 seeds (default --out docs/benchmarks/against)",
}

ALL_NAMES = {**BENCHMARKS, **EXTRAS, **ACCELERATOR, **EXTERNAL, **REVISIONS}


def compose_config(overrides: list[str]) -> DictConfig:
    """The real config tree with overrides, as ``rlspeed`` composes it."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="config", overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlspeed-bench",
        description="Benchmarks: " + "; ".join(f"{k}: {v}" for k, v in ALL_NAMES.items()),
    )
    parser.add_argument("names", nargs="+", metavar="NAME", help="a benchmark name, or all")
    parser.add_argument("--quick", action="store_true", help="a small version (under a minute)")
    parser.add_argument(
        "--out",
        type=Path,
        help="results folder (default: bench-results; against: the checkout's"
        " docs/benchmarks/against)",
    )
    parser.add_argument("--script", type=Path, help="purejaxrl: PureJaxRL's purejaxrl/dqn.py")
    parser.add_argument(
        "--python", help="purejaxrl: the Python that runs --script (default: this one)"
    )
    parser.add_argument(
        "--purejaxrl",
        type=Path,
        metavar="DIR",
        help="jaxenvs: a saved copy of PureJaxRL's repository (its purejaxrl/ppo.py)",
    )
    parser.add_argument(
        "--purejaxrl-python",
        metavar="PYTHON",
        help="jaxenvs: the Python that runs PureJaxRL's script (jax, gymnax 0.0.9, flax,"
        " optax, distrax; default: this one)",
    )
    parser.add_argument(
        "--rejax", metavar="PYTHON", help="jaxenvs, sacpqn: a Python with rejax installed"
    )
    parser.add_argument(
        "--cleanrl",
        type=Path,
        metavar="DIR",
        help="sacpqn, threads: a saved copy of CleanRL's repository"
        " (cleanrl/sac_continuous_action.py, cleanrl/pqn.py, cleanrl/dqn.py, cleanrl_utils/)",
    )
    parser.add_argument(
        "--cleanrl-python",
        metavar="PYTHON",
        help="sacpqn, threads: the Python that runs CleanRL's scripts (torch, gymnasium"
        " 0.29.1, tyro, tensorboard; default: this one)",
    )
    parser.add_argument(
        "--search",
        action="append",
        metavar="SEARCH",
        help="searches: only this shipped search (repeatable; default: every one)",
    )
    parser.add_argument(
        "--rev", help="against: the git revision compared (default: origin/main, else HEAD~1)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="against: interleaved pairs per workload (default 5; quick 2); jaxenvs, sacpqn:"
        " runs of each program after its warm-up (default 5; quick 1); threads: rounds of"
        " every variant (default 3; quick 1), and of each CleanRL pair (default 5)",
    )
    args = parser.parse_args(argv)
    known = ALL_NAMES
    names = args.names
    peer_options = (args.purejaxrl, args.purejaxrl_python, args.rejax, args.cleanrl)
    if names == ["all"]:
        from rlspeed.bench.dmc import playground_problem

        names = list(BENCHMARKS) + (["purejaxrl"] if args.script else [])
        names += [] if playground_problem() else list(EXTRAS)
        if any(option is not None for option in peer_options):
            from rlspeed.bench.jaxenvs import gymnax_problem

            # jaxenvs only with gymnax: `all` runs what it can.
            wanted = [n for n in PEER_BENCHMARKS if n != "jaxenvs" or gymnax_problem() is None]
            names += [n for n in wanted if n not in names]
    unknown = [n for n in names if n not in known]
    if unknown:
        print(
            f"rlspeed-bench: invalid NAME={unknown[0]}: expected all or one of {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    if args.search:
        from rlspeed.bench.searches import shipped_searches

        wrong = [search for search in args.search if search not in shipped_searches()]
        if wrong:
            print(
                f"rlspeed-bench: invalid --search={wrong[0]}: expected one of "
                + ", ".join(shipped_searches()),
                file=sys.stderr,
            )
            return 2
    if "dmc" in names:
        from rlspeed.bench.dmc import playground_problem

        problem = playground_problem()
        if problem:
            print(problem, file=sys.stderr)
            return 2
    if "purejaxrl" in names:
        from rlspeed.bench.purejaxrl import missing_script

        problem = missing_script(args.script)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    peers = None
    if any(name in PEER_BENCHMARKS for name in names):
        from rlspeed.bench.jaxenvs import gymnax_problem
        from rlspeed.bench.peers import find_peers

        try:
            peers = find_peers(
                args.purejaxrl, args.purejaxrl_python, args.rejax, args.cleanrl,
                args.cleanrl_python,
            )  # fmt: skip
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        problem = gymnax_problem() if "jaxenvs" in names else None
        if problem:
            print(problem, file=sys.stderr)
            return 2
    if args.repeats is not None and args.repeats < 1:
        print(
            f"rlspeed-bench: invalid --repeats={args.repeats}: expected 1 or more", file=sys.stderr
        )
        return 2
    if "against" in names:
        from rlspeed.bench.against import revision_problem

        problem = revision_problem(args.rev)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    register_configs()
    for name in names:
        print(f"== {name}: {known[name]}{' (quick)' if args.quick else ''}", flush=True)
        start = time.perf_counter()
        module = importlib.import_module(f"rlspeed.bench.{name}")
        external: dict[str, object] = {}
        if name in PEER_BENCHMARKS:
            external = {"peers": peers, "repeats": args.repeats}
        elif name in EXTERNAL:
            external = {"script": args.script, "python": args.python}
        if name in REVISIONS:
            external = {"rev": args.rev, "repeats": args.repeats}
        if name == "searches":
            external = {"only": args.search}
        # against's default folder is its own (None): the checkout's docs/benchmarks/against.
        out = args.out if name in REVISIONS else args.out or Path("bench-results")
        paths = module.run(out, args.quick, compose_config, **external)
        print(f"   {time.perf_counter() - start:.1f} s -> " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
