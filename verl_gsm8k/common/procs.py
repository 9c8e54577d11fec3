"""The one module that reads other processes and stops them, over psutil (every environment of
this project has it: accelerate, peft and vLLM require it).

Reading: this user's live processes (zombies left out), a process's descendants and memory, the
variables of its environment a caller names, whether it blocks SIGTERM (psutil has no signal
mask: the ``SigBlk`` line of /proc/PID/status), the name ``ps`` would show first. A process that
ended meanwhile, or is not ours to read, is simply not there: each reader says so by its result.

Stopping, one policy for the launcher's supervisor and its reaper (launch/supervise.py,
launch/reap.py): SIGKILL at once to a process that blocks SIGTERM (verl's, started so by the
launcher: a SIGTERM would only wait in its mask), SIGTERM to the others, SIGKILL to what is left
``grace_s`` later; no sleep beyond the moment the last one has ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil

STATUS = "/proc/{pid}/status"


def ours() -> Iterator[psutil.Process]:
    """This user's live processes, this one left out."""
    uid, me = os.getuid(), os.getpid()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != me and proc.uids().real == uid and proc.status() != psutil.STATUS_ZOMBIE:
                yield proc


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch); None when it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def environ(pid: int, names: Sequence[str]) -> dict[str, str] | None:
    """The ``names`` that process ``pid``'s environment holds; None when it is gone or not ours."""
    try:
        env = psutil.Process(pid).environ()
    except psutil.Error:
        return None
    return {name: env[name] for name in names if name in env}


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """Every live process started under ``pid`` (those re-parented to init are not)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it, those still alive."""
    return [p for p in (pid, *descendants(pid)) if alive(p)]


def memory_kib(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in KiB; (0, 0) once it is gone or unreadable."""
    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return 0, 0
    return getattr(info, "pss", 0) // 1024, info.rss // 1024


def blocks_sigterm(pid: int) -> bool:
    """True when the process has SIGTERM in its signal mask: only SIGKILL ends it."""
    try:
        status = Path(STATUS.format(pid=pid)).read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def name(pid: int) -> str:
    """What ``ps`` would show first: Ray's workers retitle themselves (``ray::TaskRunner``); for
    ``python -m X`` or ``python path/x.py``, ``python X``."""
    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
        if not argv or not argv[0]:
            return proc.name()
    except psutil.Error:
        return "?"
    first = argv[0].split(" ")[0]
    base = os.path.basename(first)
    if base.startswith("python") and len(argv) > 1:
        rest = [a for a in argv[1:] if a]
        scripts = [a for a in rest if not a.startswith("-")]
        module = rest[rest.index("-m") + 1] if "-m" in rest[:-1] else scripts[0] if scripts else ""
        return f"python {os.path.basename(module)}"[:60]
    return base[:60]


def send(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(
    find: Callable[[], Sequence[int]], grace_s: float, kill_rounds: int = 20
) -> tuple[set[int], set[int]]:
    """Stop every process ``find`` returns, rescanning (a dying raylet may still start a worker):
    SIGKILL at once to those that block SIGTERM, SIGTERM to the others, SIGKILL to what is left
    after ``grace_s``. (every pid seen, the pids that took a SIGKILL)."""
    seen: set[int] = set()
    killed: set[int] = set()
    end = time.monotonic() + grace_s
    left = list(find())
    while left and time.monotonic() < end:
        seen.update(left)
        deaf = [pid for pid in left if blocks_sigterm(pid)]
        send(deaf, signal.SIGKILL)
        killed.update(deaf)
        send([pid for pid in left if pid not in deaf], signal.SIGTERM)
        left = wait_gone(find, min(1.0, max(0.0, end - time.monotonic())))
    for _ in range(kill_rounds):
        if not left:
            break
        seen.update(left)
        send(left, signal.SIGKILL)
        killed.update(left)
        left = wait_gone(find, 0.5)
    return seen, killed


def wait_gone(find: Callable[[], Sequence[int]], seconds: float) -> list[int]:
    """What ``find`` still returns after up to ``seconds`` (polled every 0.2 s)."""
    end = time.monotonic() + seconds
    left = list(find())
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = list(find())
    return left
