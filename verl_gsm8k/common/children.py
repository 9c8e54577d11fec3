"""A child that dies with the process that started it, however that one dies (a SIGKILL runs no
handler, and the child would run on orphaned). Linux's parent-death signal reaches the direct
child only and fires when the *thread* that started it ends: start such children from a thread
that outlives them. Standard library only.

    subprocess.Popen(cmd, start_new_session=True, preexec_fn=dies_with_this_process())
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """Popen's ``preexec_fn`` (None off Linux): SIGKILL, or SIGTERM for a child that must stop
    children of its own (``vllm serve``). prctl is resolved here, so the forked child makes one
    call, taking no lock another thread might have held at the fork."""
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()
    return lambda: _arm(prctl, sig, parent)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """The same, armed from inside a child whose starter is not ours (torchrun's workers)."""
    if sys.platform.startswith("linux"):
        _arm(ctypes.CDLL(None, use_errno=True).prctl, sig, os.getppid())


def _arm(prctl: Callable[..., int], sig: int, parent: int) -> None:
    prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent died before the call: no signal would come
        os._exit(1)
