"""The peer's side of ``rlspeed-bench jaxenvs`` and ``sacpqn``: run by the peer's own Python
(one with PureJaxRL's or rejax's dependencies, not rlspeed's), as a file:

    PYTHON rlspeed/bench/peer_run.py purejaxrl PATH/TO/purejaxrl/ppo.py --config JSON --seeds N
    PYTHON rlspeed/bench/peer_run.py rejax ppo --config JSON --seeds N

It trains the way each project's README shows (``jax.jit(make_train(config))(key)``, and
``jax.vmap`` of it over the seeds for several; ``jax.jit(algo.train)``, likewise, after
``rejax.get_algo(name).create(**config)``), waits for the result and prints one JSON line:
what the run reached and the versions it ran with. Only the standard library is imported at
the top: the peer's packages are imported inside the process that has them, never by rlspeed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import runpy
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

VERSIONS = ("jax", "jaxlib", "flax", "optax", "distrax", "gymnax", "rejax", "numpy")
# Episodes per seed behind the reported training return (rlspeed's recent_return uses 20).
RECENT = 20


def _versions() -> dict[str, str]:
    found = {}
    for name in VERSIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def _keys(seed: int, seeds: int) -> Any:
    import jax

    key = jax.random.PRNGKey(seed)
    return key if seeds == 1 else jax.random.split(key, seeds)


def _train(train: Any, keys: Any, seeds: int) -> Any:
    """``train`` jitted (vmapped over the keys for several seeds), run to its end."""
    import jax

    program = jax.jit(train) if seeds == 1 else jax.jit(jax.vmap(train))
    return jax.block_until_ready(program(keys))


def recent_return(returns: Any, ended: Any, seeds: int) -> float:
    """The mean over seeds of each seed's last ``RECENT`` finished episodes' returns, from
    per-step arrays (leading axis: seeds when there are several, then time)."""
    import numpy as np

    returns = np.asarray(returns, dtype=float).reshape(seeds, -1)
    ended = np.asarray(ended, dtype=bool).reshape(seeds, -1)
    means = [r[e][-RECENT:].mean() for r, e in zip(returns, ended, strict=True) if e.any()]
    return float(np.mean(means)) if means else float("nan")


def purejaxrl(script: Path, config: dict[str, Any], seeds: int, seed: int) -> dict[str, Any]:
    """PureJaxRL's ``make_train`` from its script. The script imports ``wrappers`` from its
    own folder; PureJaxRL's wrappers.py also imports brax and navix at its top, so where
    those are missing the same two wrappers (FlattenObservationWrapper, LogWrapper) come
    from gymnax.wrappers.purerl, which has them for gymnax envs."""
    import jax

    if not hasattr(jax, "tree_map"):  # jax >= 0.6 dropped it; the scripts call it
        jax.tree_map = jax.tree.map  # type: ignore[attr-defined]
    sys.path.insert(0, str(script.parent))
    try:
        importlib.import_module("wrappers")
        wrappers = str(script.parent / "wrappers.py")
    except ImportError:
        sys.modules["wrappers"] = importlib.import_module("gymnax.wrappers.purerl")
        wrappers = "gymnax.wrappers.purerl"
    make_train = runpy.run_path(str(script), run_name="purejaxrl_script")["make_train"]
    out = _train(make_train(dict(config)), _keys(seed, seeds), seeds)
    info = out["metrics"]
    value = recent_return(info["returned_episode_returns"], info["returned_episode"], seeds)
    kind = f"last {RECENT} training episodes"
    return {"return": value, "return_kind": kind, "wrappers": wrappers}


def rejax(algo: str, config: dict[str, Any], seeds: int, seed: int) -> dict[str, Any]:
    """rejax's algorithm ``algo`` created from ``config``; its evaluation at the end."""
    import numpy as np

    agent = importlib.import_module("rejax").get_algo(algo).create(**config)
    _, (_, returns) = _train(agent.train, _keys(seed, seeds), seeds)
    final = np.asarray(returns)[..., -1, :]  # the last evaluation's episodes (every seed)
    return {"return": float(final.mean()), "return_kind": "rejax's last evaluation"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=["purejaxrl", "rejax"])
    parser.add_argument("what", help="purejaxrl: the script's path; rejax: the algorithm")
    parser.add_argument("--config", required=True, help="the config, as JSON")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = json.loads(args.config)
    if args.peer == "purejaxrl":
        result = purejaxrl(Path(args.what), config, args.seeds, args.seed)
    else:
        result = rejax(args.what, config, args.seeds, args.seed)
    print(json.dumps({**result, "seeds": args.seeds, "versions": _versions()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
