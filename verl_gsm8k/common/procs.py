"""The one module that reads and stops other processes, over psutil (one that ended, or is not ours
to read, is not there)."""

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil


def ours() -> Iterator[psutil.Process]:
    """This user's live processes but this one."""
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
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).create_time()
    return None


def environ(pid: int, names: Sequence[str]) -> dict[str, str] | None:
    """The ``names`` in ``pid``'s environment; None when it is gone or not ours."""
    with contextlib.suppress(psutil.Error):
        env = psutil.Process(pid).environ()
        return {name: env[name] for name in names if name in env}
    return None


def session_of(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return os.getsid(pid)
    return None


def group_of(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return os.getpgid(pid)
    return None


def tree(pid: int) -> list[int]:
    """``pid`` and every live process under it."""
    under = []
    with contextlib.suppress(psutil.Error):
        under = [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return [p for p in (pid, *under) if alive(p)]


def memory_kib(pid: int) -> tuple[int, int]:
    """(PSS, RSS) in KiB; (0, 0) once gone."""
    with contextlib.suppress(psutil.Error):
        info = psutil.Process(pid).memory_full_info()
        return getattr(info, "pss", 0) // 1024, info.rss // 1024
    return 0, 0


def blocks_sigterm(pid: int) -> bool:
    """SIGTERM in the process's signal mask (psutil has none: /proc's SigBlk)."""
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/status").read_text().split("SigBlk:")[1].split()[0]
        return bool(int(status, 16) >> (signal.SIGTERM - 1) & 1)
    return False


def name(pid: int) -> str:
    """What ``ps`` shows first; ``python X`` for ``python -m X`` or ``python path/X``."""
    try:
        proc = psutil.Process(pid)
        argv = [a for a in proc.cmdline() if a] or [proc.name()]
    except psutil.Error:
        return "?"
    base = os.path.basename(argv[0].split(" ")[0])
    if base.startswith("python") and len(argv) > 1:
        rest = argv[argv.index("-m") + 1 :] if "-m" in argv[:-1] else argv[1:]
        base = "python " + os.path.basename(next((a for a in rest if a[0] != "-"), ""))
    return base[:60]


def send(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(find: Callable[[], Sequence[int]], grace_s: float) -> tuple[set[int], set[int]]:
    """Stop what ``find`` returns, rescanning: SIGKILL at once to a process blocking SIGTERM,
    SIGTERM to others, SIGKILL after ``grace_s``; (the pids seen, those SIGKILLed)."""
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
    for _ in range(20):
        if not left:
            break
        seen.update(left)
        send(left, signal.SIGKILL)
        killed.update(left)
        left = wait_gone(find, 0.5)
    return seen, killed


def wait_gone(find: Callable[[], Sequence[int]], seconds: float) -> list[int]:
    """What ``find`` still returns after up to ``seconds``."""
    end = time.monotonic() + seconds
    left = list(find())
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = list(find())
    return left
