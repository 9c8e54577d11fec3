"""vLLM's engine and worker processes of a launch live through a SIGTERM from outside it.

A SIGTERM to every process of a launch (Slurm's time limit without ``B:``, ``scontrol
requeue``, a preemption, ``ray job stop``) is a stop request: the trainer saves the step in
flight and stops (stop_on_sigterm.py). Every process verl starts inherits the SIGTERM the
launcher blocks, except vLLM's: its ``EngineCore`` and its ``Worker`` are spawned from a thread
of the rollout's Ray worker that has the signal unblocked, and vLLM installs its own handler in
them (vllm/v1/engine/core.py ``run_engine_core``, ~1339: shut the engine down). They ended on
the signal, and the rollout of the step in flight failed unsaved (measured, docs/slurm.md).

vLLM runs every ``vllm.general_plugins`` entry point in each process it starts
(``load_general_plugins``: ``EngineCore.__init__``, the worker's ``init_worker``), in the main
thread, before its engine loop and its handler. There, in a process of a launch
(``GSM8K_LAUNCH_ID``) that vLLM started (``multiprocessing.parent_process()``), this blocks
SIGTERM in the main thread, which every thread started after it inherits, and one thread waits
for the signal (``sigwaitinfo``), which tells who sent it:
- vLLM's own teardown (the process's parent, or another process of the launch: the engine
  shutting its worker down, the rollout's worker shutting the engine down) gets vLLM's handler as
  before: the thread unblocks the signal for itself and sends it to itself, so the interpreter
  runs the handler in the main thread, as for any signal (or the default action ends the process
  where vLLM has none installed);
- a sender from outside the launch is ignored, in one line: the trainer's stop request ends the
  launch, and the launcher stops whatever is left (SIGKILL: its STOP_GRACE_S, Slurm's KillWait).
Elsewhere (an evaluation's vLLM, the rollout's own Ray worker, a process without the launch id)
nothing is done.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

from verl_gsm8k.common.launch_env import ENV_LAUNCH, launch_of
from verl_gsm8k.guard import say

_started = False


def _from_the_launch(sender: int, launch: str) -> bool:
    return sender in (os.getpid(), os.getppid()) or launch_of(sender) == launch


def _deliver_to_self() -> None:
    """The SIGTERM the waiting thread took, delivered as if it had not been blocked: to this
    thread, with the signal unblocked for it alone (the interpreter then runs the Python handler
    in the main thread; SIG_DFL ends the process)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _wait_for_sigterm(launch: str, title: str) -> None:
    said = False
    while True:
        sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
        if _from_the_launch(sender, launch):
            _deliver_to_self()
        elif not said:
            say(f"SIGTERM to vLLM's {title} (pid {os.getpid()}) from pid {sender}, outside the "
                "launch: ignored (the trainer's stop request ends the launch)")  # fmt: skip
            said = True


def install() -> bool:
    """vLLM's general-plugin entry point (pyproject.toml): see the module docstring. True when
    the signal was blocked here and the waiting thread started."""
    global _started
    launch = os.environ.get(ENV_LAUNCH)
    if _started or not launch or multiprocessing.parent_process() is None:
        return False
    if threading.current_thread() is not threading.main_thread():
        return False  # a mask set here would leave the main thread's handler in reach
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    title = multiprocessing.current_process().name
    thread = threading.Thread(
        target=_wait_for_sigterm, args=(launch, title), name="gsm8k-vllm-sigterm", daemon=True
    )
    thread.start()
    _started = True
    return True
