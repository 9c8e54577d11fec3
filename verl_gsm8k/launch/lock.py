"""One launch at a time per run directory: two would write the same checkpoints over each other.

The lock is flock(2) on RUN_DIR/.launch.lock, held by the launcher alone, through a descriptor
no process it starts inherits: the kernel releases it when the launcher ends, however it ends.
verl's driver dies with the launcher (launch/supervise.py ``start``), so no process of a launch
outlives its lock by more than its shutdown. The file names the launch that holds it. A launch
that finds it held waits LOCK_WAIT_S seconds (a requeued job whose predecessor is still saving),
then refuses in one line, before it has touched anything. Processes of an earlier launch into
RUN_DIR that are still there are found by their environment (verl_gsm8k/launch/reap.py): those
of a launch whose launcher has ended are stopped; the others are waited for, then refused the
same way.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from pathlib import Path

from verl_gsm8k.common import procs
from verl_gsm8k.common.run_dir import lock_path
from verl_gsm8k.launch import reap


class Busy(Exception):
    """The run directory is in use: the one line to say, exit 2."""


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _holder(lock: Path) -> str:
    try:
        return lock.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def lock_run_dir(run_dir: Path, stamp: str, wait_s: int, say) -> int:
    """Take the run directory's lock for as long as this process lives (its descriptor, not
    inheritable); raise Busy otherwise."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_path(run_dir)
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    if not _try_lock(fd):
        if wait_s > 0:
            holder = _holder(lock) or "another launch"
            say(f"recipe: {run_dir} is in use by {holder}: waiting up to LOCK_WAIT_S={wait_s} s "
                "for it to end", err=True)  # fmt: skip
        end = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() >= end:
                os.close(fd)
                raise Busy(_busy_line(run_dir, lock))
            time.sleep(0.5)
    # the holder's line at once: a launch refused while this one checks names this one
    os.ftruncate(fd, 0)
    os.write(fd, f"launch {stamp}, pid {os.getpid()} on {socket.gethostname()}\n".encode())
    if reap.check_run_dir(str(run_dir), wait_s) != 0:
        os.close(fd)
        raise Busy("")  # reap.check_run_dir said why
    return fd


def _busy_line(run_dir: Path, lock: Path) -> str:
    holder = _holder(lock)
    alive = "still running"
    found = re.search(r", pid (\d+) on (\S+)", holder)
    if found and found.group(2) == socket.gethostname() and not procs.alive(int(found.group(1))):
        # the launcher is gone but the lock is held: by a process that inherited it (a launch of
        # an earlier version of this project passed it on), which fuser names
        alive = f"its launcher has ended, another process holds the lock: fuser -v {lock} names it"
    return (
        f"recipe: {run_dir} is in use by {holder or 'another launch'} ({alive}): one launch at a "
        "time per run directory; wait for it to end (LOCK_WAIT_S), stop it, or set another "
        "EXPERIMENT_NAME"
    )
