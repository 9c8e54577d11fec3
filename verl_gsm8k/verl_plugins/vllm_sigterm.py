"""vLLM's processes of a launch live through a SIGTERM from outside it (the trainer's stop ends the
launch). vLLM unblocks SIGTERM with its own handler (v1/engine/core.py run_engine_core) but runs
vllm.general_plugins first: here (GSM8K_LAUNCH_ID) SIGTERM is blocked and a thread forwards one
from the parent or the launch to vLLM's handler and ignores, in one line, one from outside."""

import multiprocessing
import os
import signal
import threading

from verl_gsm8k.common.launch_env import ENV_LAUNCH, launch_of
from verl_gsm8k.guard import say

_started = False


def _wait_for_sigterm(launch: str, title: str) -> None:
    said = False
    while True:
        sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
        if sender in (os.getpid(), os.getppid()) or launch_of(sender) == launch:
            # as if never blocked: the interpreter runs the handler in the main thread
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            try:
                signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            finally:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        elif not said:
            say(f"SIGTERM to vLLM's {title} (pid {os.getpid()}) from pid {sender}, outside the "
                "launch: ignored (the trainer's stop request ends the launch)")  # fmt: skip
            said = True


def install() -> bool:
    """vLLM's general-plugin entry point (pyproject.toml); True when the thread started."""
    global _started
    launch = os.environ.get(ENV_LAUNCH)
    if _started or not launch or multiprocessing.parent_process() is None:
        return False
    if threading.current_thread() is not threading.main_thread():
        return False  # a mask set here would leave the main thread's handler in reach
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    title = multiprocessing.current_process().name
    threading.Thread(target=_wait_for_sigterm, args=(launch, title), name="gsm8k-vllm-sigterm",
                     daemon=True).start()  # fmt: skip
    _started = True
    return True
