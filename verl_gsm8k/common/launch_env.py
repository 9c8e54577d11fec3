"""A launch's two variables in every process it starts: which processes belong to a launch."""

import os
import socket

from verl_gsm8k.common import procs
from verl_gsm8k.common.run_dir import metrics_stamp, stamp_time

ENV_LAUNCH = "GSM8K_LAUNCH_ID"
ENV_RUN_DIR = "GSM8K_LAUNCH_RUN_DIR"


def new_launch_id(stamp: str) -> str:
    return f"{stamp}-{os.getpid()}-{socket.gethostname()}"


def launcher_ended(launch: str) -> bool:
    """``launch``'s launcher ran on this host and is gone (its pid ended, or was taken)."""
    stamp, _, rest = launch.partition("-")
    pid, _, host = rest.partition("-")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if (began := stamp_time(stamp)) is None:
        return False
    started = procs.started_at(int(pid)) if procs.alive(int(pid)) else None
    return started is None or started > began + 1  # the launcher started before its stamp


def launch_of(pid: int) -> str | None:
    """The launch id process ``pid`` carries, or None."""
    return (procs.environ(pid, (ENV_LAUNCH,)) or {}).get(ENV_LAUNCH)


def launch_stamp() -> str | None:
    """This launch's stamp, in a process verl started, or None."""
    return metrics_stamp(os.environ.get("VERL_FILE_LOGGER_PATH", ""))
