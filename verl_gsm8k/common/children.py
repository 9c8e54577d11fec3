"""A child process that dies with the process that started it, however that one dies.

The merge starts verl's merger, and the evaluation starts ``vllm serve``, each in its own session
(``start_new_session``), so that SIGTERM, Ctrl-C or an error can stop the child's whole process
group. A SIGKILL of ours (an out-of-memory killer, a scheduler past its grace) reaches no handler,
and the child would run on, orphaned: a merger writing a model nobody renames into place, a
server holding its GPU memory and port. Linux's parent-death signal ends it:

    subprocess.Popen(cmd, start_new_session=True, preexec_fn=dies_with_this_process())

It reaches the direct child only (so a child with children of its own gets SIGTERM, to stop
them, or arms its own children: ``die_with_parent``), and it fires when the *thread* that
started the child ends: start such children from a thread that outlives them (every caller uses
the main thread). Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """Popen's ``preexec_fn``: the child gets ``sig`` when this process dies; None (no
    preexec_fn) off Linux. SIGKILL for a child without children of its own; SIGTERM for one that
    must stop its own (``vllm serve`` stops its engine processes on SIGTERM, and leaves them
    running, orphaned, on SIGKILL). ctypes resolves ``prctl`` here, in the parent, so the forked
    child only makes one call: no import, no lock another thread might have held at the fork."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    return lambda: _arm(prctl, sig, parent)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """The same signal armed from inside a child whose starter is not ours (torchrun's workers):
    ``sig`` when the parent dies; this process ends now if it already has (off Linux: nothing)."""
    if sys.platform.startswith("linux"):
        _arm(ctypes.CDLL(None, use_errno=True).prctl, sig, os.getppid())


def _arm(prctl: Callable[..., int], sig: int, parent: int) -> None:
    """``sig`` on the parent's death; exit now if ``parent`` died before the call (no signal
    would come)."""
    prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(1)
