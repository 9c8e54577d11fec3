"""A child that dies with the process that started it. Linux's parent-death signal fires when the
starting *thread* ends: start it from a thread that outlives it.
"""

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """Popen's ``preexec_fn`` (None off Linux); prctl resolved here, so the forked child takes no
    lock another thread might have held at the fork."""
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()
    return lambda: _arm(prctl, sig, parent)


def die_with_parent() -> None:
    """The same, armed from inside a child whose starter is not ours."""
    if sys.platform.startswith("linux"):
        _arm(ctypes.CDLL(None, use_errno=True).prctl, signal.SIGKILL, os.getppid())


def _arm(prctl: Callable[..., int], sig: int, parent: int) -> None:
    prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)
