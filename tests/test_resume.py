"""Checkpoint resume and ``mode=eval`` through the real CLI.

A run cut by SIGTERM and resumed with ``resume=<its folder>`` must end where the same run
uninterrupted ends: same parameters, same score and counters. The cut lands wherever the
signal finds the run (after its first progress line); the loops hold the signal until the
end of the iteration, so the checkpoint holds a whole one wherever that is.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import mlflow
import numpy as np
import pytest

from rlspeed import statefile
from rlspeed.checkpoint import RESUME_FILE, seed_file
from rlspeed.core.algos.loops.host import ResumePoint
from rlspeed.errors import ConfigError, deferred_interrupts
from tests.conftest import (
    assert_one_line_error,
    logged_rows,
    refused_line,
    run_cli,
    saved_agent,
    start_cli,
    vouch,
)

# Tiny DQN runs on GridWorld (one-hot of 25 cells): a few seconds each.
DQN = [
    "algo=dqn",
    "task=gridworld",
    "algo.hidden_sizes=[16]",
    "algo.learning_starts=200",
    "algo.buffer_size=1000",
    "algo.batch_size=32",
    "algo.target_network_frequency=200",
    "tracking=none",
    "progress=plain",
]
PATHS = {
    "torch-gym-sync": ["backend=torch", "env=gym-sync", "num_envs=4", "total_steps=3000"],
    # The envs live in worker processes: their state is taken and put back there.
    "torch-gym-async": ["backend=torch", "env=gym-async", "num_envs=4", "total_steps=3000"],
    # Every chunk logs and evaluates, so the run lasts well past its first progress line.
    "flax-jax-vmap": ["backend=flax", "env=jax-vmap", "num_envs=8", "total_steps=24000"],
}
LOGS = ["log_every=400", "eval_every=400"]
# What must match exactly (wall-time rates aside).
SAME = ("score", "rolling_step_reward", "recent_return", "env_steps", "gradient_updates")


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def _cut_after_first_log(args: list[str], cwd: Path, group: bool = False) -> str:
    """Start the CLI, SIGTERM it once its first progress line appears (``group``: every
    process of it, env workers included, as a scheduler does); returns its output."""
    with start_cli(args, cwd, stderr=subprocess.STDOUT, process_group=0) as proc:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if " - step " in line:
                if group:
                    os.killpg(proc.pid, signal.SIGTERM)
                else:
                    proc.send_signal(signal.SIGTERM)
                break
        lines += proc.stdout.readlines()
        proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines)
    return "".join(lines)


@pytest.mark.slow  # 15-30 s per path: three runs through the CLI, one cut by SIGTERM
@pytest.mark.parametrize("path", list(PATHS))
def test_sigterm_then_resume_ends_like_an_uninterrupted_run(tmp_path, path):
    args = [*DQN, *PATHS[path], *LOGS]
    whole = run_cli([*args, "hydra.run.dir=whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    output = _cut_after_first_log([*args, "hydra.run.dir=cut"], tmp_path, "async" in path)
    cut = _metrics(tmp_path / "cut")
    assert cut["status"] == "KILLED", output[-2000:]
    total = int(PATHS[path][-1].partition("=")[2])
    assert 0 < cut["env_steps"] < total, "the run ended before the signal: lengthen it"

    # Another config cannot continue it.
    other = run_cli([*args, "seed=9", "resume=cut", "hydra.run.dir=other"], tmp_path)
    assert_one_line_error(
        other,
        "rlspeed: invalid resume=cut: expected a run of this config (it ran with seed=1, "
        "this run has seed=9)",
    )
    assert other.returncode == 2 and not (tmp_path / "other").exists()

    # Tracking may change on resume: one path records the resumed run in MLflow.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = ["tracking=mlflow", f"tracking.uri={uri}"] if path == "torch-gym-sync" else []
    resumed = run_cli([*args, *tracking, "resume=cut", "hydra.run.dir=resumed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    if tracking:
        client = mlflow.tracking.MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("rlspeed").experiment_id])
        assert run.info.status == "FINISHED"
        assert run.data.tags["rlspeed.resumed_from"] == str((tmp_path / "cut").resolve())
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "charts/SPS")]
        assert steps[0] > cut["env_steps"] and steps[-1] == total
    # Progress goes on from the saved step, not from 0.
    first = next(line for line in resumed.stdout.splitlines() if " - step " in line)
    assert int(first.split(" - step ")[1].split("/")[0].replace(",", "")) > cut["env_steps"]
    a, b = _metrics(tmp_path / "whole"), _metrics(tmp_path / "resumed")
    assert b["status"] == "FINISHED"
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    assert saved_agent(tmp_path / "whole") == saved_agent(tmp_path / "resumed")
    # Every logged row alike, the one after the cut too (its interval spans both runs).
    assert logged_rows(tmp_path / "whole") == logged_rows(tmp_path / "resumed")

    # mode=eval scores the saved agent as training's final evaluation did, and films it.
    evaluated = run_cli(
        ["mode=eval", "checkpoint=resumed", "video=episode.gif", "hydra.run.dir=eval"], tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert f"rlspeed: score {a['score']:.4f}" in evaluated.stdout
    assert (tmp_path / "eval" / "episode.gif").stat().st_size > 0  # in the eval's folder


def test_a_signal_waits_for_the_end_of_the_iteration():
    """The loops' guard: SIGTERM is handed to the run's handler at ``check()``, a second
    one at once, and the handler is back in place after the block."""

    def handler(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"), deferred_interrupts() as check:
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("rest of the iteration")
            check()
            reached.append("next iteration")
        assert reached == ["rest of the iteration"]
        with pytest.raises(KeyboardInterrupt), deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after a second signal")
        assert reached == ["rest of the iteration"]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_state_that_cannot_be_taken_costs_the_resume_file_alone():
    """An engine whose state cannot be taken (a gym-async worker that died): taking the
    state on the way out does not raise (the engine still closes, the other files are
    written); writing the resume file raises why."""

    class DeadWorkers:
        def state_dict(self) -> dict:
            raise EOFError("the env worker is gone")

        def load_state_dict(self, state: dict) -> None: ...

    point = ResumePoint(engine=DeadWorkers())
    point.freeze()
    with pytest.raises(EOFError, match="the env worker is gone"):
        point.state()


def test_resume_may_change_the_thread_count_but_not_what_it_trains(tmp_path, make_cfg):
    """A run saved with one thread count (another machine, or before threads=auto chose
    one) resumes with any other; a key that changes training still refuses it."""
    from omegaconf import OmegaConf

    from rlspeed.checkpoint import save_resume, training_keys
    from rlspeed.config_tree import flatten
    from rlspeed.run_folders import check_resume

    saved = make_cfg(["backend.threads=0"])
    OmegaConf.save(saved, tmp_path / "config.yaml", resolve=True)  # as a run writes it
    state = {"state": [], "iterations": 0, "monitor": {}}  # the default: a fused run
    save_resume({**state, "config": training_keys(flatten(saved))}, tmp_path / RESUME_FILE)
    vouch(tmp_path)  # the config.yaml written here rather than by a run
    check_resume(make_cfg(["backend.threads=1", f"resume={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"it ran with seed=1, this run has seed=7\)"):
        check_resume(make_cfg(["seed=7", f"resume={tmp_path}"]))


# ---------------------------------------------------------------- run folders not to trust

# Tiny Q-learning runs, one of each kind: host-driven (torch) and fused (flax).
QUICK = ["algo=qlearn", "task=gridworld", "num_envs=2", "total_steps=200", "log_every=100"]
QUICK += ["eval_every=200", "tracking=none", "progress=none"]
TORCH = [*QUICK, "backend=torch", "env=gym-sync"]
FLAX = [*QUICK, "backend=flax", "env=jax-vmap"]


class _MakesFolder:
    """A pickle that creates a folder when it is read: what a hostile file could run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (str(self.path),))


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory, make_cfg) -> dict[str, Path]:
    """The folder of a finished run of each kind, run in-process."""
    from rlspeed.run import run

    folders = {}
    for name, args in {"torch": TORCH, "flax": FLAX}.items():
        folders[name] = tmp_path_factory.mktemp(name)
        with contextlib.chdir(folders[name]):
            run(make_cfg(args))
    return folders


def _hostile_archive(path: Path, marker: Path) -> None:
    """A resume file whose tree names an array that is a pickle (an object array)."""
    tree = np.frombuffer(b'{"format":2,"obs":{"$array":0}}', dtype=np.uint8)
    np.savez(path, tree=tree, **{"0": np.array([_MakesFolder(marker)], dtype=object)})


def _write_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(_MakesFolder(marker)))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[data.index(b'"monitor"') + 1] ^= 0x20  # in the tree: its checksum no longer matches
    path.write_bytes(bytes(data))


def _earlier_format(path: Path) -> None:
    """The resume file as format 2 labelled it (its replay kept two observations each)."""
    state = statefile.load(path)
    with path.open("wb") as file:
        statefile.dump({**state, "format": 2}, file)


def _old_format(folder: Path, marker: Path) -> None:
    (folder / RESUME_FILE).unlink()
    _write_pickle(folder / "resume.pkl", marker)


def _vouched(damage: Callable[[Path, dict, Path], None]) -> Callable[[Path, dict, Path], None]:
    """``damage`` done by someone who also rewrites the folder's SHA256SUMS to match: the
    checks behind the digests must hold on their own."""

    def damage_and_vouch(folder: Path, runs: dict, marker: Path) -> None:
        damage(folder, runs, marker)
        vouch(folder)

    return damage_and_vouch


def _flip_bytes(path: Path) -> None:
    """16 bytes near the end inverted, as a failing disk or copy might."""
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 400, len(data) - 384):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


NOT_AS_WRITTEN = "is not the file rlspeed wrote (damaged, or replaced): its SHA-256 differs"

# Damage to a copy of the torch run's folder -> a fragment of the one line, for resume= and
# mode=eval alike.
DAMAGED_CONFIG = {
    "config.yaml edited": (
        lambda folder, runs, marker: _other_grid_size(folder),
        f"expected a readable config.yaml (config.yaml {NOT_AS_WRITTEN}",
    ),
    "config.yaml unparseable": (
        _vouched(lambda folder, runs, marker: (folder / "config.yaml").write_text("algo: [dq")),
        "expected a readable config.yaml (",
    ),
    "config.yaml empty": (
        _vouched(lambda folder, runs, marker: (folder / "config.yaml").write_text("")),
        "expected a config.yaml as rlspeed runs write (it has no algo.name)",
    ),
    "config.yaml reading the environment": (
        _vouched(
            lambda folder, runs, marker: (folder / "config.yaml").write_text(
                (folder / "config.yaml").read_text() + "stolen: ${oc.env:HOME}\n"
            )
        ),
        "(ValueError: stolen is an interpolation; rlspeed writes values)",
    ),
    "config.yaml of 2 MB": (
        lambda folder, runs, marker: (folder / "config.yaml").write_text("#" * (2 << 20)),
        "(config.yaml is 2,097,152 bytes, more than any run's config.yaml (1,048,576))",
    ),
    "no SHA256SUMS": (
        lambda folder, runs, marker: (folder / "SHA256SUMS").unlink(),
        "(config.yaml has no SHA256SUMS beside it: an rlspeed before digests wrote it, or not "
        "rlspeed; to vouch for the folder's files: cd run && sha256sum checkpoint.pt ",
    ),
}
# What is done to a copy of the torch run's folder -> a fragment of resume='s one line.
DAMAGED = {
    **DAMAGED_CONFIG,
    "resume file truncated": (
        lambda folder, runs, marker: _truncate(folder / RESUME_FILE),
        f"expected a readable {RESUME_FILE} ({RESUME_FILE} {NOT_AS_WRITTEN}",
    ),
    "resume file truncated, SHA256SUMS too": (
        _vouched(lambda folder, runs, marker: _truncate(folder / RESUME_FILE)),
        f"expected a readable {RESUME_FILE} (BadZipFile",
    ),
    "resume file corrupt, SHA256SUMS too": (
        _vouched(lambda folder, runs, marker: _flip_a_byte(folder / RESUME_FILE)),
        f"expected a readable {RESUME_FILE} (BadZipFile: Bad CRC-32",
    ),
    "resume file a pickle": (
        _vouched(lambda folder, runs, marker: _write_pickle(folder / RESUME_FILE, marker)),
        f"expected a readable {RESUME_FILE} (ValueError: not an .npz archive)",
    ),
    "resume file with an object array": (
        _vouched(lambda folder, runs, marker: _hostile_archive(folder / RESUME_FILE, marker)),
        f"expected a readable {RESUME_FILE} (ValueError: Object arrays cannot be loaded",
    ),
    "a flax run's resume file": (
        lambda folder, runs, marker: shutil.copy(runs["flax"] / RESUME_FILE, folder),
        f"expected a readable {RESUME_FILE} ({RESUME_FILE} {NOT_AS_WRITTEN}",
    ),
    "a flax run's resume file, SHA256SUMS too": (
        _vouched(lambda folder, runs, marker: shutil.copy(runs["flax"] / RESUME_FILE, folder)),
        f"expected a run of this config (its {RESUME_FILE} has backend.name=flax, this run "
        "has backend.name=torch)",
    ),
    "resume file of an earlier format": (
        _vouched(lambda folder, runs, marker: _earlier_format(folder / RESUME_FILE)),
        f"expected a {RESUME_FILE} of format 3 (it has format 2: an earlier rlspeed's",
    ),
    "resume.pkl of an older rlspeed": (
        lambda folder, runs, marker: _old_format(folder, marker),
        f"expected a run folder with {RESUME_FILE}: its resume.pkl was saved by an older "
        "rlspeed in a format that is not read, for safety",
    ),
}


def _other_grid_size(folder: Path) -> None:
    config = folder / "config.yaml"
    config.write_text(config.read_text().replace("  size: 5\n", "  size: 7\n"))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:300])


# What is done to a copy of the torch run's folder -> a fragment of mode=eval's one line.
DAMAGED_AGENTS = {
    **DAMAGED_CONFIG,
    "checkpoint with 16 bytes flipped": (
        lambda folder, runs, marker: _flip_bytes(folder / "checkpoint.pt"),
        "expected agent files that a run of its algo=qlearn backend=torch task=gridworld wrote,"
        f" whole (checkpoint.pt {NOT_AS_WRITTEN}",
    ),
    "checkpoint cut short, SHA256SUMS too": (
        _vouched(lambda folder, runs, marker: _cut(folder / "checkpoint.pt")),
        "expected agent files that a run of its algo=qlearn backend=torch task=gridworld wrote",
    ),
    "checkpoint a pickle that runs code": (
        _vouched(lambda folder, runs, marker: _write_pickle(folder / "checkpoint.pt", marker)),
        "whole (UnpicklingError: Weights only load failed.",
    ),
    "a flax run's config": (
        _vouched(lambda folder, runs, marker: shutil.copy(runs["flax"] / "config.yaml", folder)),
        "a run of its algo=qlearn backend=flax task=gridworld wrote, whole",
    ),
    "an unknown algorithm": (
        _vouched(
            lambda folder, runs, marker: (folder / "config.yaml").write_text(
                (folder / "config.yaml").read_text().replace("name: qlearn", "name: nosuch")
            )
        ),
        "a run of its algo=nosuch backend=torch",
    ),
}


@pytest.mark.parametrize(
    ("key", "args", "case"),
    [("resume", [*TORCH, "resume=run"], case) for case in DAMAGED]
    + [("checkpoint", ["mode=eval", "checkpoint=run"], case) for case in DAMAGED_AGENTS],
)
def test_a_damaged_run_folder_is_one_line_before_anything_is_created(
    key, args, case, saved_runs, tmp_path, monkeypatch, capsys
):
    """The check the command runs before Hydra starts (in-process here) reads the run
    folder's files whole (resume=: its config and resume files; mode=eval: its config and
    every agent): a damaged or foreign one is one line, exit 2, nothing created, no code run."""
    damage, fragment = (DAMAGED if key == "resume" else DAMAGED_AGENTS)[case]
    marker = tmp_path / "code-ran"
    shutil.copytree(saved_runs["torch"], tmp_path / "run")
    damage(tmp_path / "run", saved_runs, marker)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    line = refused_line(args, capsys)
    assert line.startswith(f"rlspeed: invalid {key}=run: ") and fragment in line, line
    assert sorted(tmp_path.rglob("*")) == before and not marker.exists()


def test_a_flax_agent_file_with_flipped_bytes_is_one_line(saved_runs, tmp_path):
    """16 inverted bytes in checkpoint.msgpack (flax reads any bytes that still parse as
    msgpack, with other weights): refused by its digest, through the real command."""
    shutil.copytree(saved_runs["flax"], tmp_path / "run")
    _flip_bytes(tmp_path / "run" / "checkpoint.msgpack")
    result = run_cli(["mode=eval", "checkpoint=run", "tracking=none"], tmp_path)
    assert_one_line_error(
        result, "rlspeed: invalid checkpoint=run: expected agent files that a run of its ",
        f"whole (checkpoint.msgpack {NOT_AS_WRITTEN}",
    )  # fmt: skip
    assert not (tmp_path / "outputs").exists()


def test_the_command_never_runs_code_from_a_run_folder(saved_runs, tmp_path):
    """Through the real command: a pickle where the resume file should be, and the
    resume.pkl of an older version, are refused unread; no folder is created."""
    marker = tmp_path / "code-ran"
    for case in ("resume file a pickle", "resume.pkl of an older rlspeed"):
        folder = tmp_path / case.replace(" ", "-")
        shutil.copytree(saved_runs["torch"], folder)
        damage, fragment = DAMAGED[case]
        damage(folder, saved_runs, marker)
        result = run_cli([*TORCH, f"resume={folder.name}", "hydra.run.dir=new"], tmp_path)
        assert_one_line_error(result, f"rlspeed: invalid resume={folder.name}: ", fragment)
        assert not (tmp_path / "new").exists() and not marker.exists()


def test_resume_reads_only_the_files_its_run_writes(saved_runs, tmp_path, make_cfg):
    """A one-seed run's resume reads its resume file alone: a resume_seed7 file or an older
    version's resume.pkl dropped into the folder is never read (a pickle would run code)."""
    from rlspeed.run import run

    folder, marker = tmp_path / "run", tmp_path / "code-ran"
    shutil.copytree(saved_runs["torch"], folder)
    _write_pickle(folder / "resume.pkl", marker)
    _write_pickle(seed_file(folder / RESUME_FILE, 7), marker)
    (tmp_path / "again").mkdir()
    with contextlib.chdir(tmp_path / "again"):
        run(make_cfg([*TORCH, f"resume={folder}"]))
    assert not marker.exists(), "a file the run did not write was read"
    assert (tmp_path / "again" / "metrics.json").is_file()


def test_an_evaluation_folder_is_named_after_the_run_it_evaluates(saved_runs, tmp_path):
    """Not after the command line's (default) backend, env, algo and task."""
    result = run_cli(["mode=eval", f"checkpoint={saved_runs['torch']}", "tracking=none"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "outputs").glob("*/*")
    assert folder.name.endswith("_eval_torch_gym-sync_qlearn_gridworld"), folder.name


@pytest.mark.parametrize("kind", ["torch", "flax"])
def test_a_q_table_of_another_grid_size_is_one_line(kind, saved_runs, tmp_path):
    """A run folder whose agent file a run on another grid size wrote (here: its config
    says size 7, its Q-table has GridWorld 5x5's 25 states) is refused, not scored."""
    shutil.copytree(saved_runs[kind], tmp_path / "run")
    _other_grid_size(tmp_path / "run")
    vouch(tmp_path / "run")
    result = run_cli(["mode=eval", "checkpoint=run", "tracking=none"], tmp_path)
    assert_one_line_error(
        result,
        "rlspeed: invalid checkpoint=run: expected agent files that a run of its algo=qlearn",
        "the shapes differ: q_table has shape (25, 4) in the file, its config.yaml makes (49, 4)",
    )
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_flax_network_of_other_hidden_sizes_is_one_line(tmp_path, make_cfg):
    """flax's reader takes each array's shape from the file: the shapes are checked."""
    from rlspeed.run import run

    args = ["algo=dqn", "task=gridworld", "backend=flax", "env=jax-vmap", "num_envs=2"]
    args += ["total_steps=400", "algo.learning_starts=100", "algo.buffer_size=500"]
    args += ["algo.hidden_sizes=[16]", "log_every=200", "tracking=none", "progress=none"]
    (tmp_path / "run").mkdir()
    with contextlib.chdir(tmp_path / "run"):  # an in-process run writes where it is
        run(make_cfg(args))
    config = tmp_path / "run" / "config.yaml"
    config.write_text(config.read_text().replace("  - 16\n", "  - 32\n"))
    vouch(tmp_path / "run")
    result = run_cli(["mode=eval", "checkpoint=run", "tracking=none"], tmp_path)
    assert_one_line_error(result, "invalid checkpoint=run: ", "the shapes differ: ", "(32,)")
    assert not (tmp_path / "outputs").exists()


# A run folder an earlier rlspeed wrote (commit 970b2f3, resume format 3, before the loops
# moved into the algorithms' files): torch PPO on CartPole, 8 envs, stopped by SIGTERM at
# env step 6,144 of 40,960; its config.yaml, resume.npz, checkpoint.pt and metrics.json.
EARLIER_RUN = Path(__file__).parent / "data" / "format3_ppo_torch"


@pytest.mark.slow  # ~18 s: a whole PPO run resumed from a folder of an earlier rlspeed
def test_a_run_an_earlier_rlspeed_saved_resumes_to_its_end_and_its_agent_scores(tmp_path):
    """Files written before a change to the code that reads them still load: ``resume=``
    continues the saved run to ``total_steps`` with the metrics it had logged kept as they
    were, and ``mode=eval`` scores its agent."""
    folder = tmp_path / "earlier"
    shutil.copytree(EARLIER_RUN, folder)
    saved = json.loads((folder / "metrics.json").read_text())

    args = [
        "backend=torch", "env=gym-sync", "algo=ppo", "task=cartpole", "total_steps=40960",
        "log_every=2048", "eval_every=10240", "tracking=none", "progress=plain",
    ]  # fmt: skip
    # It has no SHA256SUMS (digests came later): refused until its user vouches for it.
    refused = run_cli([*args, f"resume={folder}"], tmp_path)
    assert_one_line_error(refused, "config.yaml has no SHA256SUMS beside it", "sha256sum ")
    vouch(folder)
    # A setting added since (PPO's observation normalisation) ran at its default then:
    # continuing with it on would change the run midway.
    changed = run_cli([*args, "algo.normalize_obs=true", f"resume={folder}"], tmp_path)
    assert_one_line_error(
        changed, "it ran before rlspeed had algo.normalize_obs", "set algo.normalize_obs=False"
    )
    resumed = run_cli(
        [*args, f"resume={folder}", f"hydra.run.dir={tmp_path / 'resumed'}"], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    assert (metrics["status"], metrics["env_steps"]) == ("FINISHED", 40960)
    steps = [row["step"] for row in metrics["history"]]
    assert steps == [2048.0 * i for i in range(1, 21)]
    # The rows logged before the stop come back from the resume file as they were.
    assert metrics["history"][: len(saved["history"])] == saved["history"]
    scored = run_cli(
        [*args, "mode=eval", f"checkpoint={folder}", f"hydra.run.dir={tmp_path / 'eval'}"],
        tmp_path,
    )
    assert scored.returncode == 0, scored.stderr
    assert "rlspeed: score " in scored.stdout + scored.stderr
