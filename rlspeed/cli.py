"""The ``rlspeed`` command: a thin Hydra entrypoint with a pre-flight config check."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rlspeed.config import register_configs


def _conf_dir() -> str:
    packaged = Path(__file__).parent / "conf"  # installed wheel: rlspeed/conf
    if packaged.is_dir():
        return str(packaged)
    return str(Path(__file__).resolve().parents[1] / "conf")  # source checkout: ./conf


CONF_DIR = _conf_dir()


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def _task(cfg: DictConfig) -> float:
    from rlspeed.run import run

    return run(cfg)


def main() -> None:
    register_configs()
    from rlspeed.preflight import preflight

    preflight(sys.argv[1:], CONF_DIR)
    _task()


if __name__ == "__main__":
    main()
