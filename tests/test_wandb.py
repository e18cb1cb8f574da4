"""tracking=wandb, with the wandb extra installed: runs recorded offline through the real
command, then read back from W&B's own run file (``run-<id>.wandb``, the file ``wandb sync``
uploads) and compared with what the run folder holds."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import re
import shlex
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from rlspeed.config_tree import flatten
from tests.conftest import RLSPEED, cli_env, free_port
from tests.test_tracking import logged_metrics

pytestmark = pytest.mark.wandb

QLEARN = ["algo=qlearn", "task=gridworld", "backend=torch", "env=gym-sync", "num_envs=1"]
OFFLINE = ["tracking=wandb", "tracking.mode=offline"]
# A W&B API key of the right shape that must never be shown or written anywhere.
FAKE_KEY = "rlspeedtest" + "0123456789abcdef" * 2 + "x" * 13


def wandb_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The command's environment: none of the caller's W&B settings or login, W&B's own
    folders (settings, cache, artifacts' staging) in ``tmp_path``."""
    env = {k: v for k, v in cli_env().items() if not k.startswith("WANDB_")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / "config"))
    env.update(WANDB_CACHE_DIR=str(home / "cache"), WANDB_DATA_DIR=str(home / "data"))
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RLSPEED, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


# ------------------------------------------------------------------ W&B's run file, read back

_BLOCK = 32 * 1024  # W&B's run file is a LevelDB-style log: records in 32 KiB blocks
_HEADER = 7  # ":W&B", 2 magic bytes, a version byte; then each chunk's crc, length, kind


def wandb_records(path: Path) -> list[Any]:
    """Every record of a ``.wandb`` file, parsed as W&B's own protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, parts, at = [], b"", _HEADER
    while at + _HEADER <= len(data):
        left = _BLOCK - at % _BLOCK
        if left < _HEADER:  # a block's tail too short for a chunk: padding
            at += left
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + _HEADER])
        if kind == 0:  # zeros: the rest of the block is padding
            at += left
            continue
        chunk = data[at + _HEADER : at + _HEADER + length]
        at += _HEADER + length
        parts = chunk if kind in (1, 2) else parts + chunk  # full/first, middle/last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
    return records


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    """What one offline W&B run folder (``wandb/offline-run-<time>-<id>``) recorded."""

    run_id: str = ""
    name: str = ""
    project: str = ""
    group: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Any] = field(default_factory=list)
    environment: Any = None
    exit_code: int | None = None


def read_offline_run(folder: Path) -> OfflineRun:
    (path,) = folder.glob("run-*.wandb")
    run = OfflineRun()
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":  # the run as started, again whenever its tags change
            run.run_id, run.name = record.run.run_id, record.run.display_name
            run.project, run.group = record.run.project, record.run.run_group
            run.tags = list(record.run.tags)
            run.config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            run.config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            run.rows.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run.summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "artifact":
            run.artifacts.append(record.artifact)
        elif kind == "environment" and record.environment.args:
            run.environment = record.environment
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(out_dir: Path) -> list[OfflineRun]:
    return [read_offline_run(f) for f in sorted((out_dir / "wandb").glob("offline-run-*"))]


def recorded_metrics(run: OfflineRun) -> dict[str, list[tuple[int, float]]]:
    """The run's rows as ``logged_metrics`` gives metrics.json's: name -> [(step, value)]."""
    metrics: dict[str, list[tuple[int, float]]] = {}
    for row in run.rows:
        for name, value in row.items():
            if name != "global_step" and not name.startswith("_"):
                metrics.setdefault(name, []).append((row["global_step"], value))
    return metrics


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def md5(path: Path) -> str:
    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


def every_byte(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


# ------------------------------------------------------------------ tests


def test_offline_run_holds_what_the_run_folder_holds(tmp_path):
    """An offline run, two seeds: W&B's run file holds every row of metrics.json (each seed's
    as seed<i>/<name>) at its env step, the config of config.yaml, what ran as tags, what
    it ran on in the config's rlspeed section, the run's files as one model artifact, and
    how it ended; the W&B API key in the environment is nowhere."""
    args = [*QLEARN, "total_steps=2000", "log_every=500", "eval_every=1000", "num_seeds=2"]
    args += [*OFFLINE, "tracking.tags=[baseline]", "progress=none", "hydra.run.dir=run"]
    result = run(args, tmp_path, wandb_env(tmp_path, WANDB_API_KEY=FAKE_KEY))
    assert result.returncode == 0, result.stderr[-3000:]
    out_dir = tmp_path / "run"
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["status"] == "FINISHED" and metrics["errors"] == []
    (recorded,) = offline_runs(out_dir)
    folder = next((out_dir / "wandb").glob("offline-run-*"))
    assert folder.name.endswith(recorded.run_id)
    assert metrics["wandb_run_id"] == recorded.run_id and metrics["mlflow_run_id"] is None
    last_lines = result.stdout.splitlines()[-2:]
    summary = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in last_lines)
    assert summary == {
        "W&B run id": recorded.run_id,
        "W&B (offline)": f"wandb sync {folder.resolve()}",
    }

    # Every row, at its env step, and nothing else: W&B's x-axis is global_step.
    expected = logged_metrics(out_dir)
    assert recorded_metrics(recorded) == expected
    assert "seed1/eval/score" in expected and sum(map(len, expected.values())) >= 4 * 20
    assert recorded.summary["status"] == "FINISHED" and recorded.exit_code == 0

    # The config as config.yaml has it, values typed; what it ran on beside it.
    config = {k: v for k, v in recorded.config.items() if k not in ("_wandb", "rlspeed")}
    assert flat(config) == flatten(OmegaConf.load(out_dir / "config.yaml"))
    assert config["algo"]["alpha"] == 0.5 and config["num_seeds"] == 2
    about = recorded.config["rlspeed"]
    assert about["version"] == importlib.metadata.version("rlspeed")
    assert about["version.wandb"] == importlib.metadata.version("wandb")
    assert about["command"].endswith(shlex.join(args))
    assert recorded.environment.args == args  # W&B's own record of the command

    assert recorded.name == "torch-gym-sync-qlearn-gridworld" and recorded.project == "rlspeed"
    assert recorded.tags == [
        "baseline", "backend=torch", "env=gym-sync", "algo=qlearn", "task=gridworld",
    ]  # fmt: skip

    (model,) = recorded.artifacts
    assert model.type == "model" and model.name == f"model-{recorded.run_id}"
    assert set(model.aliases) == {"latest", "finished"}
    files = {entry.path: entry for entry in model.manifest.contents}
    names = ["checkpoint_seed0.pt", "checkpoint_seed1.pt", "config.yaml", "metrics.json"]
    assert sorted(files) == sorted([*names, "learning_curve.png"])
    for name, entry in files.items():  # the files as they are in the run folder
        assert entry.digest == md5(out_dir / name), name

    everything = every_byte(tmp_path) + (result.stdout + result.stderr).encode()
    assert FAKE_KEY.encode() not in everything


def test_a_killed_run_continues_in_the_same_wandb_run_when_slurm_requeues_it(tmp_path):
    """SIGTERM ends a run KILLED (exit code 130 in W&B); the SLURM job requeued continues the
    same W&B run (a second offline folder of the same id, for `wandb sync` to append);
    resume= of the killed folder is a new W&B run that names the folder it resumed."""
    args = [*QLEARN, "total_steps=8000", "log_every=500", "eval_every=4000"]
    args += [*OFFLINE, "checkpoint_every=500", "progress=plain", "hydra.run.dir=job"]
    env = wandb_env(tmp_path, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="0")
    with subprocess.Popen(
        [RLSPEED, *args], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    ) as proc:  # fmt: skip
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if " - step " in line:
                proc.send_signal(signal.SIGTERM)
                break
        lines += proc.stdout.readlines()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines)[-3000:]
    job = tmp_path / "job"
    cut = json.loads((job / "metrics.json").read_text())
    assert cut["status"] == "KILLED" and 0 < cut["env_steps"] < 8000, "lengthen the run"
    (killed,) = offline_runs(job)
    assert killed.exit_code == 130 and killed.summary["status"] == "KILLED"
    assert set(killed.artifacts[0].aliases) == {"latest", "killed"}
    assert recorded_metrics(killed) == logged_metrics(job)

    resumed = run([*args[:-1], "resume=job", "hydra.run.dir=resumed"], tmp_path, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (new,) = offline_runs(tmp_path / "resumed")
    assert new.run_id != killed.run_id and new.exit_code == 0
    assert new.config["rlspeed"]["resumed_from"] == str(job.resolve())

    requeued = run(args, tmp_path, {**env, "SLURM_RESTART_COUNT": "1"})
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    first, again = offline_runs(job)
    assert first == killed and again.run_id == killed.run_id
    assert again.exit_code == 0 and again.summary["status"] == "FINISHED"
    assert again.config["rlspeed"]["slurm_restarts"] == "1"
    assert json.loads((job / "metrics.json").read_text())["wandb_run_id"] == killed.run_id
    # The attempts' rows together: each from its own start, the second's to the end.
    steps = [row["global_step"] for row in again.rows if "eval/score" in row]
    assert steps[-1] == 8000


def test_a_wandb_that_cannot_be_reached_costs_one_line_and_no_result(tmp_path):
    """Online with an API key but no W&B answering (a closed port): the run trains to its
    end and keeps every file; W&B's failure is one line and metrics.json's error, and the
    key is neither shown nor written. Not logged in at all: one line too."""
    args = [*QLEARN, "total_steps=1000", "log_every=500", "eval_every=1000", "progress=none"]
    base = f"http://127.0.0.1:{free_port()}"
    env = wandb_env(tmp_path, WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL=base)
    env["WANDB_INIT_TIMEOUT"] = "3"
    result = run(
        [*args, "tracking=wandb", "tracking.mode=online", "hydra.run.dir=a"], tmp_path, env
    )
    assert result.returncode == 1, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["status"] == "FAILED" and metrics["env_steps"] == 1000
    assert metrics["history"] and (tmp_path / "a" / "checkpoint.pt").exists()
    (error,) = metrics["errors"]
    assert error.startswith("W&B could not start the run (") and base in error
    assert result.stderr.splitlines()[-1] == f"rlspeed: {error}", result.stderr
    everything = every_byte(tmp_path) + (result.stdout + result.stderr).encode()
    assert FAKE_KEY.encode() not in everything

    env, out = wandb_env(tmp_path), tmp_path / "b"  # no key, no netrc: not logged in
    result = run(
        [*args, "tracking=wandb", "tracking.mode=online", "hydra.run.dir=b"], tmp_path, env
    )
    assert result.returncode == 1, result.stderr[-3000:]
    (error,) = json.loads((tmp_path / "b" / "metrics.json").read_text())["errors"]
    assert "W&B could not start the run (" in error and "wandb login" in error
    assert result.stderr.splitlines() == [f"rlspeed: {error}"]
    assert error.endswith(f"so the run is not fully recorded there; its outputs are in {out}")


def test_without_wandb_installed_the_command_says_how_to_install_it(tmp_path):
    """wandb hidden from the command (as where the extra is not installed): one line naming
    the extra, exit code 2, nothing created."""
    code = (
        "import sys; sys.modules['wandb'] = None; from rlspeed.cli import main; "
        f"sys.argv = ['rlspeed', *{[*QLEARN, 'tracking=wandb']!r}]; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=wandb_env(tmp_path),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0] == (
        'rlspeed: invalid tracking=wandb: expected an installed wandb: pip install "rlspeed[wandb]"'
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_a_bad_mode_is_one_line_before_anything_is_created(tmp_path):
    result = run([*QLEARN, "tracking=wandb", "tracking.mode=cloud"], tmp_path, wandb_env(tmp_path))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0] == (
        "rlspeed: invalid tracking.mode=cloud: expected null (W&B's default), online, "
        "offline, disabled"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_disabled_mode_records_nothing_and_the_run_goes_on(tmp_path):
    args = [*QLEARN, "total_steps=500", "log_every=500", "eval_every=500", "progress=none"]
    args += ["tracking=wandb", "tracking.mode=disabled", "hydra.run.dir=run"]
    result = run(args, tmp_path, wandb_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["wandb_run_id"] is None and metrics["errors"] == []
    assert not list((tmp_path / "run").glob("wandb/*run-*"))
    assert "W&B" not in result.stdout
