"""DRY_RUN=1's end: verl's entry point with Hydra's ``--cfg job``, in this process."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def print_config(
    verl_module: str, config_path: Path, config_name: str, overrides: list[str]
) -> int:
    sys.argv = [
        verl_module,
        "--config-path",
        str(config_path),
        "--config-name",
        config_name,
        "--cfg",
        "job",
        *overrides,
    ]
    try:
        runpy.run_module(verl_module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # Hydra ends --cfg job with sys.exit
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    return 0
