"""``devices``: a fused run's lanes spread over 1, 2 and 4 devices (``backend.devices``):
lanes/s and env steps/s against the number of lanes, PPO on CartPole at CleanRL's settings.

Each row is the real command, run twice in fresh processes: first from an empty compilation
cache (its wall time includes compiling the sharded programs), then again with the programs
it cached, whose compiled calls give the rates. Where JAX sees no GPU the devices are the
CPU's, forced (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, the one-device rows
too, so every row has XLA's threading alike): they share the CPU's cores, so the rows show
what spreading costs or gains there, not what N accelerators give. On GPUs a row asks for N
of them, up to as many as the machine has.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlspeed.bench.common import Table, run_rlspeed, write_results
from rlspeed.bench.overhead import PPO_CARTPOLE_FUSED
from rlspeed.tracking._environment import gpu_names

DEVICES = (1, 2, 4)
LANES = (1, 2, 4, 8, 16, 32)
# Env steps per lane: 128 of PPO's iterations (4 envs x 128 steps each).
STEPS = 65_536
# A smoke of the whole path: one lane count on 1 and 2 devices, four iterations per lane.
QUICK_DEVICES, QUICK_LANES, QUICK_STEPS = (1, 2), (4,), 2_048

COLUMNS = [
    "devices",
    "devices_used",
    "lanes",
    "env_steps",
    "gradient_updates",
    "first_wall_time_s",
    "wall_time_s",
    "compiled_calls_s",
    "lanes_per_s",
    "env_steps_per_s",
    "updates_per_s",
    "mean_score",
]


def run(out_dir: Path, quick: bool, compose: Any) -> list[Path]:
    gpus = len(gpu_names())
    platform = "GPUs" if gpus else "forced CPU devices"
    table = Table(
        "devices",
        f"PPO on CartPole, lanes (seeds) spread over {platform}",
        COLUMNS,
        notes=[
            "lanes_per_s: lanes trained to the end per second of the compiled calls (the"
            " cached run's compiled_calls_s); env_steps_per_s and updates_per_s: every"
            " lane's together over the same seconds. wall_time_s: the cached run's whole"
            " command; first_wall_time_s: the first run's, compiling its programs.",
            "devices_used: lanes are laid out on as few of the devices as hold the fewest"
            " lanes per device (1 lane uses 1 device; 5 lanes on 4 devices use 3).",
            "SPEC goal: lanes/s grows with the devices; each lane equal to its one-device run"
            " (tests/test_devices.py).",
        ],
    )
    if not gpus:
        table.notes.append(
            "Forced CPU devices share the machine's cores: on CPU the rows measure the cost of"
            " spreading one program, not the gain of more accelerators."
        )
    counts = [d for d in (QUICK_DEVICES if quick else DEVICES) if not gpus or d <= gpus]
    steps = QUICK_STEPS if quick else STEPS
    with tempfile.TemporaryDirectory(prefix="rlspeed-bench-devices-") as tmp:
        for devices in counts:
            forced = f"--xla_force_host_platform_device_count={devices}"
            env = {} if gpus else {"XLA_FLAGS": forced}
            for lanes in QUICK_LANES if quick else LANES:
                overrides = [
                    *PPO_CARTPOLE_FUSED,
                    f"num_seeds={lanes}",
                    f"total_steps={steps}",
                    f"log_every={steps // 4}",
                    f"eval_every={steps}",
                    f"backend.devices={devices}",
                ]
                prefix = "" if gpus else f"XLA_FLAGS={forced} "
                table.configs.append(prefix + "rlspeed " + " ".join(overrides))
                cache = f"backend.compilation_cache={tmp}/xla-{devices}-{lanes}"
                run_dir = Path(tmp) / f"devices{devices}_lanes{lanes}"
                first = run_rlspeed([*overrides, cache], run_dir, env)
                cached = run_rlspeed(
                    [*overrides, cache], run_dir.with_name(run_dir.name + "_"), env
                )
                compiled = cached["compiled_calls_s"]
                table.add(
                    devices=devices,
                    devices_used=len(cached["devices"]),
                    lanes=lanes,
                    env_steps=cached["env_steps"],
                    gradient_updates=cached["gradient_updates"],
                    first_wall_time_s=first["wall_time_s"],
                    wall_time_s=cached["wall_time_s"],
                    compiled_calls_s=compiled,
                    lanes_per_s=lanes / compiled,
                    env_steps_per_s=cached["env_steps"] / compiled,
                    updates_per_s=cached["gradient_updates"] / compiled,
                    mean_score=cached["score"],
                )
    return write_results(table, out_dir, _plot)


def _plot(table: Table, ax: Any) -> None:
    for devices in sorted({row["devices"] for row in table.rows}):
        rows = [row for row in table.rows if row["devices"] == devices]
        label = f"{devices} device{'s' if devices > 1 else ''}"
        ax.plot(
            [r["lanes"] for r in rows],
            [r["env_steps_per_s"] for r in rows],
            marker="o",
            label=label,
        )
    lanes = sorted({row["lanes"] for row in table.rows})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lanes, [str(n) for n in lanes])
    ax.minorticks_off()
    ax.set_xlabel("lanes (seeds) in one program")
    ax.set_ylabel("env steps / s of the compiled calls (all lanes)")
    ax.legend()
