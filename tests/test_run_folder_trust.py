"""What rlspeed reads back from a run folder is what it wrote there (SHA256SUMS), and a run
folder never makes rlspeed import a module: not by ``task.import``, not by a Gymnasium id's
``module:`` prefix."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from rlspeed import digests
from rlspeed.errors import ConfigError
from tests.conftest import assert_one_line_error, cli_env, run_cli, vouch

TINY = ["num_envs=2", "total_steps=200", "log_every=100", "eval_every=200"]
TINY += ["tracking=none", "progress=none"]
# A module whose import leaves a file: what a hostile module in a run folder could do.
MARKING_MODULE = "from pathlib import Path\nPath(__file__).with_name('imported').touch()\n"


@pytest.fixture(scope="module")
def gym_run(tmp_path_factory, make_cfg) -> Path:
    """A finished host-driven run of CartPole-v1 through task=gym, run in-process."""
    from rlspeed.run import run

    folder = tmp_path_factory.mktemp("gym")
    args = ["task=gym", "task.id=CartPole-v1", "algo=vpg", "backend=torch", "env=gym-sync"]
    with contextlib.chdir(folder):
        run(make_cfg([*args, *TINY]))
    return folder


def test_every_file_a_run_writes_is_listed_as_sha256sum_checks_it(gym_run):
    listed = (gym_run / digests.MANIFEST).read_text().splitlines()
    names = sorted(line.split("  ", 1)[1] for line in listed)
    assert names == sorted(
        ["checkpoint.pt", "config.yaml", "learning_curve.png", "metrics.json", "resume.npz"]
    )
    checked = subprocess.run(
        ["sha256sum", "-c", digests.MANIFEST], cwd=gym_run, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_rename_that_fails_leaves_the_old_file_listed(tmp_path):
    """Between the two renames (the file's, the manifest's) the manifest lists both
    versions; a write that fails leaves the old version and its digest alone."""
    from rlspeed.checkpoint import atomic_write

    path = tmp_path / "metrics.json"
    atomic_write(path, lambda file: file.write(b"old"))
    with pytest.raises(RuntimeError), digests.recording(path, "0" * 64):
        listed = (tmp_path / digests.MANIFEST).read_text()
        assert listed.count("metrics.json") == 2  # the old digest and the coming one
        raise RuntimeError("the rename failed")
    digests.check(path, 100, "metrics file")  # the old version, still listed
    assert (tmp_path / digests.MANIFEST).read_text().count("metrics.json") == 1
    atomic_write(path, lambda file: file.write(b"new"))
    digests.check(path, 100, "metrics file")
    path.write_bytes(b"bad")
    with pytest.raises(digests.DigestError, match="is not the file rlspeed wrote"):
        digests.check(path, 100, "metrics file")


def _names_a_module(folder: Path, module: str) -> None:
    """The run's config.yaml as a hostile folder would have it, its SHA256SUMS rewritten to
    match: the id imports ``module`` when Gymnasium makes the env, and that module sits in
    the folder, where Python looks first when the folder is the working directory."""
    config = folder / "config.yaml"
    config.write_text(config.read_text().replace("id: CartPole-v1", f"id: {module}:CartPole-v1"))
    (folder / f"{module}.py").write_text(MARKING_MODULE)
    vouch(folder)


def test_a_gymnasium_id_in_a_run_folder_imports_nothing(gym_run, tmp_path, monkeypatch):
    """``task.id: module:Env`` is refused by mode=eval and rlspeed.load in one line, nothing
    imported; from Python it loads once the user imported the module."""
    import shutil

    import rlspeed

    folder = tmp_path / "run"
    shutil.copytree(gym_run, folder)
    _names_a_module(folder, "folder_module")
    # The module importable wherever it is looked for: only the refusal keeps it unimported.
    path = {"PYTHONPATH": str(folder)}
    monkeypatch.syspath_prepend(str(folder))
    refused = run_cli(["mode=eval", "checkpoint=.", "tracking=none"], folder, env=path)
    assert_one_line_error(
        refused,
        "rlspeed: invalid checkpoint=.: expected a run whose task.id=folder_module:CartPole-v1 "
        "names a module imported already (folder_module is not): rlspeed imports no module a "
        "run folder names (from Python: import folder_module first)",
    )
    with pytest.raises(ConfigError, match="task.id=folder_module:CartPole-v1 names a module"):
        rlspeed.load(folder)
    assert not (folder / "imported").exists() and "folder_module" not in sys.modules
    assert not (folder / "outputs").exists()
    script = "import folder_module, rlspeed\nprint(rlspeed.load('.'))\n"
    loaded = subprocess.run(
        [sys.executable, "-c", script], cwd=folder, env=cli_env(), capture_output=True, text=True
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert "Agent(algo=vpg, task=gym" in loaded.stdout and (folder / "imported").exists()


def test_a_resume_file_whose_arrays_this_run_cannot_take_is_one_line(tmp_path, make_cfg):
    """A replay buffer saved with other shapes (an earlier rlspeed's final-observation ring,
    sized by the time limit) is refused in one line, not broadcast or a traceback."""
    import contextlib

    from rlspeed import statefile
    from rlspeed.checkpoint import RESUME_FILE
    from rlspeed.run import run

    # tuned=false: the in-process run below is composed without the CLI's tuned defaults.
    args = ["task=gym", "task.id=CartPole-v1", "algo=dqn", "backend=torch", "env=gym-sync"]
    args += [*TINY, "total_steps=400", "algo.learning_starts=100", "algo.buffer_size=300"]
    args += ["tuned=false"]
    (tmp_path / "run").mkdir()
    with contextlib.chdir(tmp_path / "run"):
        run(make_cfg(args))
    state = statefile.load(tmp_path / "run" / RESUME_FILE)
    state["parts"]["buffer"]["final_obs"] = state["parts"]["buffer"]["final_obs"][:12]
    with open(tmp_path / "run" / RESUME_FILE, "wb") as file:
        statefile.dump(state, file)
    vouch(tmp_path / "run")
    resumed = run_cli([*args, "resume=run", "hydra.run.dir=again"], tmp_path)
    assert resumed.returncode == 1
    assert resumed.stderr.strip().splitlines() == [
        "rlspeed: invalid resume=run: expected a resume file whose state this run can take "
        "(ValueError: the shapes differ: final_obs has shape (12, 4) in the file, its "
        "config.yaml makes (302, 4))"
    ]
