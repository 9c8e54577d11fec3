"""A launch's two variables in the environment of every process it starts, and how another
process reads them.

The launcher (verl_gsm8k/launch/) starts verl with ``GSM8K_LAUNCH_ID`` (unique per launch: stamp,
launcher pid, host) and ``GSM8K_LAUNCH_RUN_DIR``; every process verl starts inherits them. They
tell which processes belong to a launch: the launcher reaps those that outlive verl
(launch/reap.py), and verl's processes tell a SIGTERM from inside the launch from one sent from
outside (verl_plugins/stop_on_sigterm.py, verl_plugins/vllm_sigterm.py), which is why this sits
below both. The launch's stamp reaches the trainers through the metrics file the launcher names
(``VERL_FILE_LOGGER_PATH``, RUN_DIR/metrics/metrics-<stamp>.jsonl). Standard library only;
Linux's /proc.
"""

from __future__ import annotations

import os
from pathlib import Path

from verl_gsm8k.common.run_dir import metrics_stamp

ENV_LAUNCH = "GSM8K_LAUNCH_ID"
ENV_RUN_DIR = "GSM8K_LAUNCH_RUN_DIR"
PROC = Path("/proc")


def launch_environ(pid: int, names: tuple[str, ...] = (ENV_LAUNCH, ENV_RUN_DIR)) -> dict[str, str]:
    """The launch's variables (or the other ``names``) in process ``pid``'s environment, those it
    has; OSError when the process is gone or not ours to read."""
    raw = (PROC / str(pid) / "environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    wanted = tuple(name.encode() for name in names)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs if k in wanted}


def launch_of(pid: int) -> str | None:
    """The launch id process ``pid`` carries (``GSM8K_LAUNCH_ID``); None when none, or gone."""
    try:
        return launch_environ(pid).get(ENV_LAUNCH)
    except OSError:
        return None


def launch_stamp() -> str | None:
    """This launch's stamp, in a process verl started (None outside a launch)."""
    return metrics_stamp(os.environ.get("VERL_FILE_LOGGER_PATH", ""))
