"""verl started and watched until it ends: its output copied to the console log, SIGTERM turned
into a stop request, Ctrl-C into a stop now, the grace kept, what outlives verl reaped.

PPO: verl's driver starts in a session of its own with SIGTERM blocked, a mask every process it
starts inherits (Ray's daemons and workers): a SIGTERM to every process of the job reaches the
launcher (a stop request, RUN_DIR/stop_requested) and leaves them running to save the step in
flight; a SIGTERM to one of them alone is a stop request too
(verl_gsm8k/verl_plugins/stop_on_sigterm.py). vLLM's engine processes unblock it (docs/slurm.md).
SFT: torchrun runs in the launcher's process group with SIGTERM blocked too and SIGINT ignored
as a background job's is; its workers read the stop request after each step
(verl_gsm8k/sft_trainer/). After STOP_GRACE_S (or at once on Ctrl-C): every process of the launch
stopped by common/procs.py's one policy (SIGKILL at once to those that block SIGTERM, SIGTERM to
the others and SIGKILL 10 s later), exit 143. A SIGKILL of the launcher ends verl too (``start``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from verl_gsm8k.common import procs
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.common.run_dir import session_path, stop_path
from verl_gsm8k.launch import reap
from verl_gsm8k.launch.slurm import ended_by_slurm, job_end, kill_wait

KILL_WAIT_S = 10  # from the SIGTERM to a process of verl's that does not block it to SIGKILL


def _blocked_session() -> None:
    """PPO's driver: SIGTERM blocked (inherited by every process it starts), its own session."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    os.setsid()


def _blocked_no_sigint() -> None:
    """SFT's torchrun: SIGTERM blocked (its workers inherit the mask), SIGINT ignored."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start(
    argv: list[str], env: Mapping[str, str], run_dir: Path, launch_id: str, ppo: bool
) -> subprocess.Popen:
    """verl, its output piped: PPO's driver with SIGTERM blocked in a session of its own, which
    RUN_DIR/.launch.session names for the reaping of what outlives it (launch/reap.py, where
    Ray's retitled workers no longer show their environment); SFT's torchrun with SIGINT off.
    Either gets SIGKILL when the launcher dies (common/children.py), and SFT's workers die with
    torchrun (sft_trainer/); Ray's workers end with the driver, its agents may linger. The run
    directory's lock, the launcher's alone (no descriptor is passed on), is free at once, and
    the relaunch stops what is left (reap.check_run_dir)."""
    mask = _blocked_session if ppo else _blocked_no_sigint
    dies = dies_with_this_process(signal.SIGKILL)

    def preexec() -> None:
        mask()
        if dies is not None:
            dies()

    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=preexec,
    )  # fmt: skip  # noqa: PLW1509  # one prctl call in the child (common/children.py)
    if ppo:
        write_atomic(session_path(run_dir), f"{proc.pid} {launch_id}\n")
    return proc


def _tee(source, log_path: Path) -> threading.Thread:
    """Copy verl's output to this process's standard output and to the console log."""

    def copy() -> None:
        out = sys.stdout.buffer
        with open(log_path, "wb") as log:
            while chunk := os.read(source.fileno(), 65536):
                for sink in (out, log):
                    try:
                        sink.write(chunk)
                        sink.flush()
                    except (OSError, ValueError):
                        pass

    thread = threading.Thread(target=copy, name="tee", daemon=True)
    thread.start()
    return thread


class Supervisor:
    """One verl launch: ``run`` returns verl's exit status (143 when the grace ran out)."""

    def __init__(
        self, run_dir: Path, grace_s: int, grace_set: bool, env: Mapping[str, str],
        say: Callable[..., None],
    ) -> None:  # fmt: skip
        self.run_dir, self.grace_s, self.grace_set = run_dir, grace_s, grace_set
        self.env, self.say = env, say
        self.deadline: float | None = None
        self.kill_now = False

    def request_stop(self, *_: object) -> None:
        """SIGTERM (a preemption: Slurm, Kubernetes, spot instances): ask the trainer to save the
        step in flight and stop; after the grace, stop verl. In a Slurm job with an end time and
        no STOP_GRACE_S of the user's, the grace runs to 5 s before the job's end (read now: a
        preemption's GraceTime moves it), which is what Slurm allows."""
        if self.deadline is not None:
            return
        now = time.time()
        self.deadline = now + self.grace_s
        why = f"STOP_GRACE_S={self.grace_s} s"
        end = None if self.grace_set else job_end(self.env)
        job = self.env.get("SLURM_JOB_ID")
        if end is not None and end - 5 > now:
            self.deadline = end - 5
            why = (f"{self.deadline - now:.0f} s: 5 s before Slurm job {job} ends; STOP_GRACE_S "
                   "sets it")  # fmt: skip
        # a requeue or scancel ends the job KillWait after this signal, not at its time limit
        ended = None if self.grace_set else ended_by_slurm(self.env)
        wait = kill_wait() if ended else None
        if wait is not None and now + wait - 5 < self.deadline:
            self.deadline = now + wait - 5
            why = (f"{self.deadline - now:.0f} s: 5 s before Slurm's SIGKILL, KillWait {wait} s "
                   f"after its {ended} of job {job}; STOP_GRACE_S sets it")  # fmt: skip
        write_atomic(stop_path(self.run_dir), f"{self.deadline:.0f}\n")
        self.say(f"recipe: SIGTERM: the trainer saves the step in flight and stops (within {why})",
                 err=True)  # fmt: skip

    def interrupt(self, *_: object) -> None:
        """Ctrl-C: stop verl now; the checkpoints saved so far stay."""
        self.say("recipe: interrupted: stopping verl", err=True)
        self.kill_now = True

    def run(
        self, argv: list[str], env: dict[str, str], log_path: Path, ppo: bool, launch_id: str
    ) -> int:
        stop_path(self.run_dir).unlink(missing_ok=True)  # an earlier launch's is not ours
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.interrupt)
        proc = start(argv, env, self.run_dir, launch_id, ppo)
        tee = _tee(proc.stdout, log_path)
        status = self._wait(proc)
        tee.join(timeout=5)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        reap.stop_launch(launch_id, str(self.run_dir))
        tee.join(timeout=5)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return status

    def _wait(self, proc: subprocess.Popen) -> int:
        while True:
            try:
                code = proc.wait(timeout=1)
                return code if code >= 0 else 128 - code
            except subprocess.TimeoutExpired:
                pass
            if self.kill_now or (self.deadline is not None and time.time() >= self.deadline):
                if not self.kill_now:
                    self.say(f"recipe: STOP_GRACE_S={self.grace_s} s are over: stopping verl",
                             err=True)  # fmt: skip
                # verl's tree now; what left it (Ray's, re-parented) is found by ``run``'s reaping
                procs.stop(lambda: procs.tree(proc.pid), KILL_WAIT_S)
                proc.wait()
                return 143
