"""A recipe's DRY_RUN=1 ends with verl's own entry point and Hydra's ``--cfg job`` (it prints the
composed config and exits), run in the launcher's process once the preflight has passed there:
verl (torch, tensordict: about 6 s of a dry run on 2 cores) is imported once. verl's entry point
runs as ``python -m`` runs it (``runpy``, as ``__main__``, its own command line), on the
overrides a launch would give it (launch/cli.py, which prints that command first).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def print_config(
    verl_module: str, config_path: Path, config_name: str, overrides: list[str]
) -> int:
    """verl's entry point with Hydra's ``--cfg job``, in this process: the composed config."""
    sys.argv = [verl_module, "--config-path", str(config_path), "--config-name", config_name,
                "--cfg", "job", *overrides]  # fmt: skip
    try:
        runpy.run_module(verl_module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # Hydra ends --cfg job with sys.exit
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0
