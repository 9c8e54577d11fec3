"""A SIGTERM to a PPO launch's process is a stop request, not a death. verl starts with SIGTERM
blocked; in a launch's process (GSM8K_LAUNCH_RUN_DIR) a thread waits for it: one from outside
writes the stop request (guard/stop.py) with STOP_GRACE_S; one from Ray's teardown is not a stop.
Ray's shutdown then SIGKILLs the processes ray.init started (they block SIGTERM)."""

import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR, launch_of
from verl_gsm8k.guard import say
from verl_gsm8k.guard.stop import SIGTERM, request
from verl_gsm8k.verl_plugins.after_import import after_import

_started = False


def _wait_for_sigterm(run_dir: Path, grace_s: float) -> None:
    ours = os.environ.get(ENV_LAUNCH)
    while True:
        sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
        if ours and sender != os.getpid() and launch_of(sender) == ours:
            continue
        try:
            if request(run_dir, time.time() + grace_s, SIGTERM):
                say(f"SIGTERM to pid {os.getpid()}: stop requested; the trainer saves the step "
                    f"in flight and stops (within STOP_GRACE_S={grace_s:.0f} s)")  # fmt: skip
        except OSError as error:
            say(f"SIGTERM to pid {os.getpid()}: no stop request written ({error})")


def _kill_at_once(node_module: ModuleType) -> None:
    original = node_module.Node.kill_all_processes

    def kill_all_processes(self: Any, check_alive: bool = True, allow_graceful: bool = False,
                           *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        return original(self, check_alive, False, *args, **kwargs)

    kill_all_processes.gsm8k_at_once = True  # type: ignore[attr-defined]
    node_module.Node.kill_all_processes = kill_all_processes


def install() -> bool:
    """Start the waiting thread where it applies; True if started."""
    global _started
    run_dir = os.environ.get(ENV_RUN_DIR)
    blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if _started or not run_dir or not blocked:  # unblocked: its handler would take the signal
        return False
    try:
        grace_s = float(os.environ.get("STOP_GRACE_S", "30"))
    except ValueError:
        grace_s = 30.0
    threading.Thread(target=_wait_for_sigterm, args=(Path(run_dir), grace_s),
                     name="gsm8k-sigterm", daemon=True).start()  # fmt: skip
    _started = True
    after_import("ray._private.node", _kill_at_once)
    return True


install()
