"""SIGTERM to any process of a PPO launch becomes the launcher's stop request, not a death.

the launcher starts verl's driver with SIGTERM **blocked** (its signal mask), and every
process verl starts inherits the mask across fork and exec: Ray's gcs and raylet, its workers (the
TaskRunner, where the trainer loop runs, the FSDP workers, vLLM's engine). Their own SIGTERM
handlers (Ray's: exit; raylet's: shut the node down, which takes every worker with it) are
installed but never run, so a SIGTERM to every process of the job (Slurm's time limit without
``B:``, ``scontrol requeue``, a preemption, ``ray job stop``) no longer kills the run before it
can save. The launcher, which gets the signal too, writes RUN_DIR/stop_requested; the trainer saves
the step in flight at its end and stops (ppo_trainer/guard_base.py); SIGKILL (Slurm's ``KillWait``,
the launcher's STOP_GRACE_S) still ends everything.

verl imports this module in every process (VERL_USE_EXTERNAL_MODULES). In a process that has
SIGTERM blocked and belongs to a launch (GSM8K_LAUNCH_RUN_DIR), a thread waits for the signal
(``sigwait``): a SIGTERM sent to this process alone (the driver, the TaskRunner) writes the stop
request itself when none is there yet, with STOP_GRACE_S from now, and says so in one line.
Elsewhere (a Ray cluster's own workers, a process started without the mask) it does nothing.

Where it applies, the local Ray that verl's driver starts (``ray.init``) is also shut down
without its "graceful" SIGTERM (``Node.kill_all_processes(allow_graceful=False)``): its
processes block the signal, so Ray would only wait 1 s per process before the SIGKILL it sends
anyway (measured: ``ray.shutdown`` 5.3 s instead of 1.4 s, docs/slurm.md).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from verl_gsm8k.common.launch_env import ENV_LAUNCH, launch_of
from verl_gsm8k.common.run_dir import STOP_FILE, stop_path
from verl_gsm8k.guard import say
from verl_gsm8k.verl_plugins.after_import import after_import

_started = False


def request_stop(run_dir: Path, grace_s: float) -> bool:
    """Write the stop request unless one is there already; True when this call wrote it."""
    final = stop_path(run_dir)
    partial = run_dir / f".{STOP_FILE}.{os.getpid()}"
    partial.write_text(f"{time.time() + grace_s:.0f}\n", encoding="utf-8")
    try:
        os.link(partial, final)  # never over the launcher's own request (its deadline wins)
        return True
    except FileExistsError:
        return False
    finally:
        partial.unlink(missing_ok=True)


def _wait_for_sigterm(run_dir: Path, grace_s: float) -> None:
    ours = os.environ.get(ENV_LAUNCH)
    while True:
        sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
        if ours and sender != os.getpid() and launch_of(sender) == ours:
            # Ray's own teardown of this process (its raylet, at the run's end), not a stop: a
            # stop comes from outside the launch (Slurm, `kill`, `ray job stop`, the launcher's
            # shell, which does not carry the launch id)
            continue
        try:
            wrote = request_stop(run_dir, grace_s)
        except OSError as error:
            say(f"SIGTERM to pid {os.getpid()}: no stop request written ({error})")
            continue
        if wrote:
            say(f"SIGTERM to pid {os.getpid()}: stop requested; the trainer saves the step in "
                f"flight and stops (within STOP_GRACE_S={grace_s:.0f} s)")  # fmt: skip


def _kill_at_once(node_module: ModuleType) -> None:
    """Ray's shutdown of the processes ``ray.init`` started: SIGKILL without the SIGTERM first
    (see the module docstring)."""
    node = node_module.Node
    original = node.kill_all_processes
    if getattr(original, "gsm8k_at_once", False):
        return

    def kill_all_processes(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) >= 2:  # (check_alive, allow_graceful, ...)
            args = (args[0], False, *args[2:])
        else:
            kwargs["allow_graceful"] = False
        return original(self, *args, **kwargs)

    kill_all_processes.gsm8k_at_once = True  # type: ignore[attr-defined]
    node.kill_all_processes = kill_all_processes


def install() -> bool:
    """Start the waiting thread where it applies (see the module docstring); True if started."""
    global _started
    run_dir = os.environ.get("GSM8K_LAUNCH_RUN_DIR")
    if _started or not run_dir:
        return False
    if signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        return False  # the signal would reach this process's handler before sigwait: leave it
    try:
        grace_s = float(os.environ.get("STOP_GRACE_S", "30"))
    except ValueError:
        grace_s = 30.0
    thread = threading.Thread(
        target=_wait_for_sigterm, args=(Path(run_dir), grace_s), name="gsm8k-sigterm", daemon=True
    )
    thread.start()
    _started = True
    after_import("ray._private.node", _kill_at_once)
    return True


install()
