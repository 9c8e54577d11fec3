"""verl started and watched: output teed to the console log, SIGTERM a stop request with a
deadline, Ctrl-C a stop now, what outlives verl reaped. verl inherits SIGTERM blocked."""

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
from verl_gsm8k.guard.stop import JOB_END, SIGTERM, read_request, request
from verl_gsm8k.launch import reap
from verl_gsm8k.launch.slurm import ended_by_slurm, job_end, kill_wait

KILL_WAIT_S = 10  # from SIGTERM to SIGKILL


def start(
    argv: list[str], env: Mapping[str, str], run_dir: Path, launch_id: str, ppo: bool
) -> subprocess.Popen:
    """verl, output piped, SIGTERM blocked, killed with the launcher; PPO in a session."""
    dies = dies_with_this_process()

    def preexec() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if ppo:
            os.setsid()
        else:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if dies is not None:
            dies()

    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=preexec)  # fmt: skip
    if ppo:
        write_atomic(session_path(run_dir), f"{proc.pid} {launch_id}\n")
    return proc


def _tee(source, log_path: Path) -> threading.Thread:
    def copy() -> None:
        with open(log_path, "wb") as log:
            while chunk := os.read(source.fileno(), 65536):
                for sink in (sys.stdout.buffer, log):
                    try:
                        sink.write(chunk)
                        sink.flush()
                    except (OSError, ValueError):
                        pass

    thread = threading.Thread(target=copy, name="tee", daemon=True)
    thread.start()
    return thread


class Supervisor:
    """One verl launch: ``run`` is verl's exit status, 143 when the launcher stopped it."""

    def __init__(
        self, run_dir: Path, grace_s: int, env: Mapping[str, str], say: Callable[..., None]
    ) -> None:
        self.run_dir, self.grace_s, self.env, self.say = run_dir, grace_s, env, say
        self.grace_set = bool(env.get("STOP_GRACE_S"))
        self.deadline: float | None = None  # of the stop under way
        self.signalled = self.kill_now = False

    def request_stop(self, *_: object) -> None:
        """SIGTERM: a stop by STOP_GRACE_S, or 5 s before the Slurm job's end or its SIGKILL."""
        if self.signalled:  # its deadline wins over one a process of verl's wrote first
            return
        self.signalled, now = True, time.time()
        deadline, why = now + self.grace_s, f"STOP_GRACE_S={self.grace_s} s"
        job = self.env.get("SLURM_JOB_ID")
        end = None if self.grace_set else job_end(self.env)
        if end is not None and end - 5 > now:
            deadline, why = end - 5, f"{end - 5 - now:.0f} s: 5 s before Slurm job {job} ends"
        ended = None if self.grace_set else ended_by_slurm(self.env)
        wait = kill_wait() if ended else None
        if wait is not None and now + wait - 5 < deadline:
            deadline = now + wait - 5
            why = (f"{wait - 5} s: 5 s before Slurm's SIGKILL, KillWait {wait} s after its "
                   f"{ended} of job {job}")  # fmt: skip
        self.deadline = deadline
        request(self.run_dir, deadline, SIGTERM, over=True)
        tail = "; STOP_GRACE_S sets it" if "Slurm" in why else ""
        self.say(f"recipe: SIGTERM: the trainer saves the step in flight and stops (within "
                 f"{why}{tail})", err=True)  # fmt: skip

    def interrupt(self, *_: object) -> None:
        self.say("recipe: interrupted: stopping verl", err=True)
        self.kill_now = True

    def run(self, argv: list[str], env: dict, log_path: Path, ppo: bool, launch_id: str) -> int:
        stop_path(self.run_dir).unlink(missing_ok=True)  # an earlier launch's is not ours
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.interrupt)
        proc = start(argv, env, self.run_dir, launch_id, ppo)
        tee = _tee(proc.stdout, log_path)
        status = self._wait(proc)
        tee.join(timeout=5)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        reap.stop_launch(launch_id, str(self.run_dir))
        tee.join(timeout=5)  # what the reaped processes held
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return status

    def _wait(self, proc: subprocess.Popen) -> int:
        while True:
            try:
                code = proc.wait(timeout=1)
                return code if code >= 0 else 128 - code
            except subprocess.TimeoutExpired:
                pass
            found = None if self.deadline else read_request(self.run_dir)
            if found and found[1] == JOB_END:  # the trainer's stop before the job's end
                self.deadline = found[0]
            if self.kill_now or (self.deadline is not None and time.time() >= self.deadline):
                if not self.kill_now:
                    self.say(f"recipe: STOP_GRACE_S={self.grace_s} s are over: stopping verl",
                             err=True)  # fmt: skip
                procs.stop(lambda: procs.tree(proc.pid), KILL_WAIT_S)
                proc.wait()
                return 143
