"""``rlspeed-bench NAME --quick`` through the installed command: every benchmark writes its
CSV, markdown and PNG, stamped with the machine, and compares equal work. No timing is
asserted: speed is what the benchmarks report, not what tests check."""

from __future__ import annotations

import csv
import subprocess
import sys
from functools import partial
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error, cli_env

RLSPEED_BENCH = str(Path(sys.executable).with_name("rlspeed-bench"))


def _bench(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # The quick benchmarks take 15-270 s on a 2-core AVX2 CPU beside another one; CI's
    # machine took over 600 s for jaxenvs, which runs 92-191 s here. Where one runs out of
    # time, what it printed (each step as it ends) says where.
    try:
        return subprocess.run(
            [RLSPEED_BENCH, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
    except subprocess.TimeoutExpired as late:
        said = [late.stdout or "", late.stderr or ""]
        printed = "\n".join(s if isinstance(s, str) else s.decode() for s in said)
        pytest.fail(f"rlspeed-bench {' '.join(args)}: no end after 600 s; it printed:\n{printed}")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


ALL_STACKS = [
    ("torch", "gym-sync"), ("cleanrl-script", "gym-sync"), ("flax", "gym-sync"),
    ("torch", "jax-vmap"), ("flax", "jax-vmap"), ("flax", "jax-vmap (cached)"),
]  # fmt: skip


def _check_equal_work(rows: list[dict[str, str]], stacks=ALL_STACKS) -> None:
    """Stacks compared side by side, and the CleanRL-style script run with the torch
    stack's hyperparameters, did the same env steps and gradient updates; the rerun from
    cached compiled programs learned exactly what the first flax + jax-vmap run did."""
    assert [(r["backend"], r["engine"]) for r in rows] == stacks
    assert len({r["env_steps"] for r in rows}) == 1
    assert len({r["gradient_updates"] for r in rows}) == 1 and int(rows[0]["gradient_updates"])
    assert float(rows[0]["speedup"]) == 1.0
    fused, cached = rows[-2:]
    for key in ("score", "rolling_step_reward", "recent_return"):
        assert cached[key] == fused[key], key


def _check_envs(rows: list[dict[str, str]], tasks=("doors", "cartpole"), counts=("1", "8")) -> None:
    modes = {"gym-sync", "gym-async", "jax-vmap", "jax-fused"}
    assert {r["task"] for r in rows} == set(tasks)
    for task in tasks:
        for num_envs in counts:
            cell = [r for r in rows if r["task"] == task and r["num_envs"] == num_envs]
            assert {r["mode"] for r in cell} == modes
    assert all(float(r["env_steps_per_s"]) > 0 for r in rows)


def _check_qlearn(rows: list[dict[str, str]]) -> None:
    assert [r["agents"] for r in rows] == ["1", "30", "1024"]
    steps_per_agent = [int(r["agent_steps"]) // int(r["agents"]) for r in rows]
    assert steps_per_agent == [20_000, 20_000, 2_048]
    assert all(float(r["mean_score"]) == 1.0 for r in rows[:2])  # the goal, in 20k steps


def _check_updates(rows: list[dict[str, str]]) -> None:
    assert [(r["algo"], r["batch_size"]) for r in rows] == [
        ("td3", "64"), ("td3", "256"), ("vpg", "256"), ("vpg", "1024"), ("dqn", "128"),
    ]  # fmt: skip
    for row in rows:
        ratio = float(row["torch_ms"]) / float(row["flax_ms"])
        assert float(row["torch_over_flax"]) == pytest.approx(ratio, rel=1e-3)


def _check_overhead(rows: list[dict[str, str]]) -> None:
    """Each case's variants did equal work; the fused runs say how much of the process
    was outside the compiled calls; ratios are against the case's last variant."""
    cases = ["ppo-cartpole-fused", "dqn-cartpole-fused", "ppo-cartpole-fused-16-seeds"]
    assert [r["case"] for r in rows[::2]] == cases
    for first, second in zip(rows[::2], rows[1::2], strict=True):
        assert first["case"] == second["case"] and float(second["ratio"]) == 1.0
        for key in ("env_steps", "gradient_updates"):
            assert first[key] == second[key] and int(first[key]) > 0, key
    one, sixteen = rows[0], rows[4]
    assert int(sixteen["env_steps"]) == 16 * int(one["env_steps"])
    for row in rows:
        assert 0 < float(row["outside_fraction"]) < 1, row


def _check_torchloop(rows: list[dict[str, str]]) -> None:
    """Per task: rlspeed with 1 thread and with every core, then the script, at equal work;
    exactly one rlspeed variant is the one backend.threads=auto picks."""
    assert [r["case"] for r in rows] == ["torch-dqn-cartpole"] * 3 + ["torch-dqn-doors"] * 3
    for task in (rows[:3], rows[3:]):
        assert [r["variant"].split(" (")[0] for r in task] == [
            "rlspeed threads=1", "rlspeed threads=all cores", "cleanrl_dqn.py"
        ]  # fmt: skip
        assert sum(r["variant"].endswith("(auto)") for r in task) == 1
        assert float(task[2]["ratio"]) == 1.0
        for key in ("env_steps", "gradient_updates"):
            assert len({r[key] for r in task}) == 1 and int(task[0][key]) > 0, key


def _check_sweep(rows: list[dict[str, str]]) -> None:
    """Each search trial by trial, then in batches: every sweep finished its trials, and a
    batched Q-learning lane learned exactly what a lone run of its trial learned."""
    assert [(r["search"], r["batch_size"]) for r in rows] == [
        ("qlearn_search", "1"), ("qlearn_search", "4"),
        ("ppo_float_search", "1"), ("ppo_float_search", "4"),
    ]  # fmt: skip
    for row in rows:
        assert row["trials"] == "4" and int(row["env_steps"]) > 0, row
        assert int(row["complete"]) + int(row["pruned"]) == 4, row
    assert float(rows[0]["ratio"]) == 1.0 == float(rows[2]["ratio"])
    assert float(rows[1]["lane_vs_lone"]) <= 1e-6


def _check_devices(rows: list[dict[str, str]]) -> None:
    """The same lanes on 1 and 2 devices did equal work, on as many devices as asked for."""
    assert [(r["devices"], r["devices_used"], r["lanes"]) for r in rows] == [
        ("1", "1", "4"), ("2", "2", "4"),
    ]  # fmt: skip
    for key in ("env_steps", "gradient_updates"):
        assert rows[0][key] == rows[1][key] and int(rows[0][key]) > 0, key
    assert int(rows[0]["env_steps"]) == 4 * 2_048
    assert all(float(r["lanes_per_s"]) > 0 for r in rows)


def _check_threads(rows: list[dict[str, str]]) -> None:
    """Per case: 1 thread and one per core, each quiet and beside the busy process; exactly
    one is the variant backend.threads=auto picks, and kept is the busy rate over the quiet."""
    assert [(r["case"], r["threads"].split(" (")[0]) for r in rows] == [
        ("td3-hopper", "1"), ("td3-hopper", "0"), ("dqn-cartpole", "1"), ("dqn-cartpole", "0"),
    ]  # fmt: skip
    for case in (rows[:2], rows[2:]):
        assert sum(r["threads"].endswith("(auto)") for r in case) == 1
    for row in rows:
        quiet, busy = float(row["quiet_updates_per_s"]), float(row["busy_updates_per_s"])
        assert quiet > 0 and busy > 0, row
        assert float(row["kept"]) == pytest.approx(busy / quiet, rel=1e-3)


def _check_searches(rows: list[dict[str, str]]) -> None:
    """The one search asked for, against its default run: trial 0 is the defaults and
    scores what the lone default run does, so the study's best is at least that."""
    (row,) = rows
    assert (row["search"], row["algo"], row["task"]) == ("qlearn_search", "qlearn", "doors")
    assert row["trials"] == "8" and int(row["complete"]) + int(row["pruned"]) == 8, row
    assert row["trial0_score"] == row["default_score"] and row["best_ge_default"] == "yes"
    ratio = float(row["sweep_s"]) / float(row["default_s"])
    assert float(row["time_ratio"]) == pytest.approx(ratio, rel=1e-6)


CHECKS = {
    "envs": _check_envs,
    "mjx": partial(_check_envs, tasks=("halfcheetah",), counts=("8",)),
    "table2": _check_equal_work,
    "cartpole": _check_equal_work,
    "qlearn": _check_qlearn,
    "updates": _check_updates,
    "overhead": _check_overhead,
    "torchloop": _check_torchloop,
    "sweep": _check_sweep,
    "devices": _check_devices,
    "threads": _check_threads,
    "searches": _check_searches,
}
# A benchmark's arguments besides --quick: searches on one search (each takes a minute or
# more on 2 cores).
QUICK_ARGS = {"searches": ["--search", "qlearn_search"]}


@pytest.mark.bench
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_quick_benchmark_writes_csv_markdown_and_plot(name, tmp_path):
    result = _bench([name, "--quick", *QUICK_ARGS.get(name, []), "--out", "results"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "results"
    files = sorted(p.name for p in out.iterdir())
    assert files == [f"{name}.{ext}" for ext in ("csv", "md", "png")]
    CHECKS[name](_rows(out / f"{name}.csv"))
    markdown = (out / f"{name}.md").read_text()
    for stamp in ("CPU:", "GPU:", "jax ", "torch ", "## Configs"):
        assert stamp in markdown, stamp
    assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.bench
def test_quick_gpu_benchmark_writes_its_three_tables(tmp_path):
    """``gpu`` runs anywhere (JAX on the CPU without an accelerator): env steps/s of both
    modes, DQN on Doors at equal work on two stacks, PPO with 16 seeds doing 16 times the
    one seed's work."""
    result = _bench(["gpu", "--quick", "--out", "results"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "results"
    names = ("gpu_dqn_doors", "gpu_envs", "gpu_ppo_seeds")
    assert sorted(p.name for p in out.iterdir()) == [
        f"{name}.{ext}" for name in names for ext in ("csv", "md", "png")
    ]
    envs = _rows(out / "gpu_envs.csv")
    assert {(r["task"], r["mode"], r["num_envs"]) for r in envs} == {
        (task, mode, n)
        for task in ("doors", "cartpole")
        for mode in ("gym-sync", "jax-fused")
        for n in ("1", "8")
    }
    stacks = [("torch", "gym-sync"), ("flax", "jax-vmap"), ("flax", "jax-vmap (cached)")]
    _check_equal_work(_rows(out / "gpu_dqn_doors.csv"), stacks)
    one, sixteen = _rows(out / "gpu_ppo_seeds.csv")
    assert (one["num_seeds"], sixteen["num_seeds"]) == ("1", "16")
    for key in ("env_steps", "gradient_updates"):
        assert int(sixteen[key]) == 16 * int(one[key]) > 0, key
    assert "GPU:" in (out / "gpu_ppo_seeds.md").read_text()


def test_unknown_benchmark_is_one_clear_line(tmp_path):
    result = _bench(["tabel2"], cwd=tmp_path)
    assert_one_line_error(result, "NAME=tabel2", "table2", "envs")
    assert not (tmp_path / "bench-results").exists()


def test_searches_with_an_unknown_search_is_one_clear_line(tmp_path):
    result = _bench(["searches", "--search", "dqn_serch", "--out", "results"], cwd=tmp_path)
    assert_one_line_error(result, "--search=dqn_serch", "dqn_search", "qlearn_search")
    assert not (tmp_path / "results").exists()


def test_purejaxrl_without_its_script_says_how_to_get_it_in_one_line(tmp_path):
    result = _bench(["purejaxrl", "--out", "results"], cwd=tmp_path)
    assert_one_line_error(result, "purejaxrl/dqn.py", "--script", "gymnax")
    assert not (tmp_path / "results").exists()


def test_purejaxrl_config_maps_to_an_rlspeed_run_of_equal_work(make_cfg):
    """The rlspeed command line of the purejaxrl benchmark does PureJaxRL's env steps and
    gradient updates (49,000 over 500,000 steps), on the fused path PureJaxRL's script is."""
    from rlspeed.bench.purejaxrl import RLSPEED_OVERRIDES, purejaxrl_work
    from rlspeed.core.algos.dqn import total_updates
    from rlspeed.core.algos.schedule import steps_run
    from rlspeed.validation import check

    cfg = make_cfg([*RLSPEED_OVERRIDES, "tracking=none"])
    cfg = check(cfg).cfg
    steps = steps_run(cfg.total_steps, cfg.num_envs)
    assert (steps, total_updates(cfg.algo, cfg.total_steps, cfg.num_envs)) == purejaxrl_work()
    assert purejaxrl_work() == (500_000, 49_000)
    assert cfg.backend.threads == 1  # auto: a small network


@pytest.mark.bench
def test_quick_against_head_writes_one_row_per_workload_with_ratios_near_one(tmp_path):
    """``against --rev HEAD``: the same code on both sides (the revision from a git worktree,
    each importing its own rlspeed), so every workload did equal work and its time ratio
    stays near 1. One pair per workload (after the warm-ups) keeps it to ~2 minutes."""
    from rlspeed.bench.against import WORKLOADS

    args = ["against", "--quick", "--rev", "HEAD", "--repeats", "1", "--out", "results"]
    result = _bench(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "results"
    assert sorted(p.name for p in out.iterdir()) == ["against.csv", "against.md", "against.png"]
    rows = _rows(out / "against.csv")
    assert [r["workload"] for r in rows] == [w.name for w in WORKLOADS]
    for row in rows:
        assert row["same_work"] == "yes" and int(row["env_steps"]) > 0, row
        assert 0.5 < float(row["ratio"]) < 2, row
        assert float(row["ratio_min"]) <= float(row["ratio"]) <= float(row["ratio_max"]), row
    markdown = (out / "against.md").read_text()
    assert "rlspeed-bench-against-" in markdown  # the old side imported the worktree's rlspeed
    for stamp in ("Machine load (uptime) before", "after", "CPU:", "## Configs"):
        assert stamp in markdown, stamp
    assert (out / "against.png").read_bytes().startswith(b"\x89PNG")
    git = ["git", "-C", str(Path(__file__).parent), "worktree", "list"]
    worktrees = subprocess.run(git, capture_output=True, text=True).stdout
    assert "rlspeed-bench-against-" not in worktrees  # the worktree is gone


def test_against_with_an_unknown_revision_is_one_clear_line(tmp_path):
    result = _bench(["against", "--rev", "no-such-revision", "--out", "results"], cwd=tmp_path)
    assert_one_line_error(result, "--rev=no-such-revision", "git revision")
    assert not (tmp_path / "results").exists()


def _without(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def _without_gymnax() -> bool:
    return _without("gymnax")


@pytest.mark.skipif(not _without_gymnax(), reason="gymnax is installed")
def test_jaxenvs_without_gymnax_says_so_in_one_line(tmp_path):
    result = _bench(["jaxenvs", "--out", "results"], cwd=tmp_path)
    assert_one_line_error(result, "jaxenvs", "gymnax extra", 'pip install "rlspeed[gymnax]"')
    assert not (tmp_path / "results").exists()


@pytest.mark.skipif(not _without("mujoco_playground"), reason="playground is installed")
def test_dmc_without_playground_says_so_in_one_line(tmp_path):
    result = _bench(["dmc", "--out", "results"], cwd=tmp_path)
    assert_one_line_error(result, "dmc", "playground extra", 'pip install "rlspeed[playground]"')
    assert not (tmp_path / "results").exists()


@pytest.mark.playground
def test_quick_dmc_trains_and_measures_a_random_policy(tmp_path):
    """One short fused PPO run on CartpoleBalance beside 64 random episodes: a uniformly
    random policy keeps the pole up for a third of CartpoleBalance's 1,000 steps (363 +- 59
    over 16 episodes, measured with the Gymnasium face), a return no bug near zero or 1,000
    gives."""
    result = _bench(["dmc", "--quick", "--out", "results"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "results"
    assert sorted(p.name for p in out.iterdir()) == [f"dmc.{ext}" for ext in ("csv", "md", "png")]
    (row,) = _rows(out / "dmc.csv")
    assert row["task"] == "CartpoleBalance" and int(row["env_steps"]) == 20_480
    assert 250 < float(row["random_return"]) < 500, row
    assert 0 <= float(row["score"]) <= 1000 and float(row["wall_s"]) > 0, row
    assert float(row["x_random"]) == pytest.approx(
        float(row["score"]) / float(row["random_return"]), rel=1e-3
    )


def test_a_peer_folder_without_its_scripts_is_one_clear_line(tmp_path):
    result = _bench(["sacpqn", "--cleanrl", str(tmp_path), "--out", "results"], cwd=tmp_path)
    assert_one_line_error(result, "--cleanrl=", "cleanrl/pqn.py", "git clone", "--cleanrl-python")
    assert not (tmp_path / "results").exists()


def _check_peer_rows(rows: list[dict[str, str]], programs: dict[str, list[str]]) -> None:
    """The programs of each workload, in order, at equal env steps and updates, each timed,
    the first the reference of the ratios."""
    assert [(r["workload"], r["program"]) for r in rows] == [
        (w, p) for w, labels in programs.items() for p in labels
    ]
    for workload in programs:
        group = [r for r in rows if r["workload"] == workload]
        assert float(group[0]["wall_vs_reference"]) == 1.0
        for row in group:
            assert row["same_work"] == "yes" and int(row["gradient_updates"]) > 0, row
            assert float(row["median_wall_s"]) > 0 and row["runs"] == "1", row


@pytest.mark.bench
def test_quick_sacpqn_without_peers_runs_rlspeeds_side_and_says_what_is_left_out(tmp_path):
    """No CleanRL or rejax here: rlspeed's two stacks of each CleanRL workload, and a line per
    peer (and for the rejax workloads, gymnax) saying how to get it, on stdout and in the notes."""
    result = _bench(["sacpqn", "--quick", "--out", "results"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "results"
    assert sorted(p.name for p in out.iterdir()) == ["sacpqn.csv", "sacpqn.md", "sacpqn.png"]
    stacks = ["rlspeed torch gym-sync", "rlspeed flax fused"]
    programs = {"sac-pendulum-cleanrl": stacks, "pqn-cartpole-cleanrl": stacks}
    if not _without_gymnax():
        programs |= {"sac-pendulum-rejax": stacks, "pqn-cartpole-rejax": stacks}
    _check_peer_rows(_rows(out / "sacpqn.csv"), programs)
    markdown = (out / "sacpqn.md").read_text()
    for fragment in ("cleanrl left out:", "rejax left out:"):
        assert fragment in markdown and f"sacpqn: {fragment}" in result.stdout, fragment
    for stamp in ("## Configs", "CPU:", "torch "):
        assert stamp in markdown, stamp


@pytest.mark.gymnax
def test_quick_jaxenvs_without_peers_writes_rates_and_rlspeeds_ppo_runs(tmp_path):
    """gymnax CartPole-v1 and Breakout-MinAtar's env rates on three engines, and rlspeed's
    PPO at each peer config (PureJaxRL's and rejax's, 1 and 16 seeds; Breakout-MinAtar)."""
    pytest.importorskip("gymnax")
    result = _bench(["jaxenvs", "--quick", "--out", "results"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "results"
    assert sorted(p.name for p in out.iterdir()) == [
        f"{name}.{ext}" for name in ("jaxenvs_ppo", "jaxenvs_rates") for ext in ("csv", "md", "png")
    ]
    rates = _rows(out / "jaxenvs_rates.csv")
    assert {(r["task"], r["mode"], r["num_envs"]) for r in rates} == {
        (task, mode, n)
        for task in ("CartPole-v1", "Breakout-MinAtar")
        for mode in ("gym-sync", "jax-vmap", "jax-fused")
        for n in ("1", "8")
    }
    fused = ["rlspeed flax fused"]
    rows = _rows(out / "jaxenvs_ppo.csv")
    _check_peer_rows(
        rows,
        {
            "ppo-cartpole-purejaxrl-1-seed": fused, "ppo-cartpole-purejaxrl-16-seeds": fused,
            "ppo-cartpole-rejax-1-seed": fused, "ppo-cartpole-rejax-16-seeds": fused,
            "ppo-breakout-minatar": fused,
        },
    )  # fmt: skip
    one, sixteen = rows[:2]
    assert int(sixteen["env_steps"]) == 16 * int(one["env_steps"])
    said = (out / "jaxenvs_ppo.md").read_text()
    # How to get the peers, with the jax the peers must share with rlspeed.
    assert "purejaxrl left out:" in said and f"pip install jax=={version('jax')} " in said
