"""One launch at a time per run directory: flock(2) on RUN_DIR/.launch.lock, waited for
LOCK_WAIT_S, then refused in one line."""

import fcntl
import os
import re
import socket
import time
from pathlib import Path

from verl_gsm8k.common import procs
from verl_gsm8k.common.run_dir import lock_path, small_text
from verl_gsm8k.launch import reap


class Busy(Exception):
    """The run directory is in use: the line to say (empty: said already)."""


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def lock_run_dir(run_dir: Path, stamp: str, wait_s: int, say) -> int:
    """The lock's descriptor, held while this process lives; Busy otherwise."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_path(run_dir)
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    end = time.monotonic() + wait_s
    if not _locked(fd) and wait_s > 0:
        say(f"recipe: {run_dir} is in use by {small_text(lock) or 'another launch'}: waiting up to "
            f"LOCK_WAIT_S={wait_s} s for it to end", err=True)  # fmt: skip
    while not _locked(fd):
        if time.monotonic() >= end:
            os.close(fd)
            raise Busy(_busy_line(run_dir, lock))
        time.sleep(0.5)
    os.ftruncate(fd, 0)  # the holder's line, for a launch refused meanwhile
    os.write(fd, f"launch {stamp}, pid {os.getpid()} on {socket.gethostname()}\n".encode())
    if reap.check_run_dir(str(run_dir), wait_s) != 0:
        os.close(fd)
        raise Busy("")
    return fd


def _busy_line(run_dir: Path, lock: Path) -> str:
    holder, alive = small_text(lock), "still running"
    found = re.search(r", pid (\d+) on (\S+)", holder)
    if found and found[2] == socket.gethostname() and not procs.alive(int(found[1])):
        # a process that inherited the lock from its ended launcher holds it
        alive = f"its launcher has ended, another process holds the lock: fuser -v {lock} names it"
    return (f"recipe: {run_dir} is in use by {holder or 'another launch'} ({alive}): one launch "
            "at a time per run directory; wait for it to end (LOCK_WAIT_S), stop it, or set "
            "another EXPERIMENT_NAME")  # fmt: skip
