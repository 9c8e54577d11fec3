"""Nothing of a launch outlives it: find every process a launch started, and end them.

The launcher (verl_gsm8k/launch/) starts verl with two variables in its environment
(common/launch_env.py), ``GSM8K_LAUNCH_ID`` (unique per launch: stamp, launcher pid, host) and
``GSM8K_LAUNCH_RUN_DIR``. Every process verl starts inherits them: the driver, the local Ray it
starts (``ray.init``: gcs, raylet, dashboard, log monitor, its process reaper), Ray's workers (the
TaskRunner, the FSDP workers, vLLM's engine) and their children, also once they are re-parented to
init or have left the launch's process group (verl's driver calls ``setpgrp`` when it starts Ray: a
kill of the launcher's group misses all of them). The launcher starts verl's driver in a session
of its own (launch/supervise.py ``start``), named in RUN_DIR/.launch.session: a process whose
environment /proc no longer shows (Ray's retitled workers) is found by its session. Only this
user's processes, on this machine, are looked at. A Ray cluster the launch attaches to
(``RAY_ADDRESS``) was started elsewhere, without these variables and outside the session: its
processes never match.

    python -m verl_gsm8k.launch.reap stop --launch ID [--grace S]   # after verl has ended
    python -m verl_gsm8k.launch.reap stop --run-dir DIR             # every launch into DIR
    python -m verl_gsm8k.launch.reap check --run-dir DIR [--wait S] # none may train beside us
    python -m verl_gsm8k.launch.reap exec -- CMD ...                # multi_node.sbatch's ray start
    python -m verl_gsm8k.launch.reap stop --slurm-ray JOB           # Slurm job JOB's Ray, here

``stop`` gives the processes a moment to end on their own (Ray's shutdown is under way when
verl exits), then SIGTERM, then SIGKILL after ``--grace`` seconds (at once to a process that
blocks SIGTERM, as the launcher starts verl's), and says in one line what it
had to stop (nothing when nothing outlived verl). ``check`` (the run-directory lock, after
``flock``) refuses in one line when processes of an earlier launch into the same run directory
still run, after waiting ``--wait`` seconds for them to end: they hold no lock (Ray's processes
do not inherit the launcher's lock file) and could still write checkpoints.

``stop --slurm-ray JOB`` ends the Ray that slurm/multi_node.sbatch started for Slurm job JOB on
this machine: each node's ``ray start --block`` runs through ``exec`` with
``GSM8K_RAY_OF_SLURM_JOB`` set to the job's id and leads its process group, which holds that
node's whole Ray (gcs, raylet, agents, workers), SIGTERM blocked: SIGKILL to every process of
those groups. Ray's other clusters on the machine (another job's, a launch's own) are not
touched, as they would be by ``ray stop --force``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR, PROC, launch_environ
from verl_gsm8k.common.run_dir import session_path


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str
    launch: str
    run_dir: str


def _name(pid: int) -> str:
    """What ``ps`` would show first: Ray's workers retitle themselves (``ray::TaskRunner``)."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        argv = []
    first = argv[0].decode(errors="replace").split(" ")[0] if argv and argv[0] else ""
    if not first:
        return (PROC / str(pid) / "comm").read_text().strip()
    base = os.path.basename(first)
    if base.startswith("python") and len(argv) > 1:  # python -m X / python [-u] path/x.py
        rest = [a.decode(errors="replace") for a in argv[1:] if a]
        scripts = [a for a in rest if not a.startswith("-")]
        module = rest[rest.index("-m") + 1] if "-m" in rest[:-1] else scripts[0] if scripts else ""
        return f"python {os.path.basename(module)}"[:60]
    return base[:60]


def _zombie(pid: int) -> bool:
    stat = (PROC / str(pid) / "stat").read_text()
    return stat[stat.rindex(")") + 2 :].startswith(("Z", "X"))


def blocks_sigterm(pid: int) -> bool:
    """True when the process has SIGTERM in its signal mask (verl's processes, started so by the
    launcher: verl_plugins/stop_on_sigterm.py): only SIGKILL ends it."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def read_session(run_dir: str) -> dict[int, tuple[str, str]]:
    """The session of the last launch into ``run_dir`` (``exec_blocked`` wrote it), as
    ``{session id: (launch id, run dir)}``; empty when there is none."""
    try:
        sid, launch = session_path(Path(run_dir)).read_text(encoding="utf-8").split()[:2]
        return {int(sid): (launch, run_dir)}
    except (OSError, ValueError):
        return {}


def launch_processes(
    match: Callable[[Proc], bool], sessions: dict[int, tuple[str, str]] | None = None
) -> list[Proc]:
    """This user's live processes that carry a launch's variables, or are in the session of one
    of ``sessions``, and ``match``. (Ray retitles its workers, setproctitle, which may overwrite
    what /proc shows of their environment; none of them leaves verl's session.)"""
    uid, me, found = os.getuid(), os.getpid(), []
    if sessions and os.getsid(0) in sessions:  # a session id used again: ours, never a survivor
        sessions = {sid: it for sid, it in sessions.items() if sid != os.getsid(0)}
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            if entry.stat().st_uid != uid or _zombie(pid):
                continue
            env = launch_environ(pid)
            if ENV_LAUNCH in env:
                proc = Proc(pid, _name(pid), env[ENV_LAUNCH], env.get(ENV_RUN_DIR, ""))
            elif sessions and os.getsid(pid) in sessions:
                launch, run_dir = sessions[os.getsid(pid)]
                proc = Proc(pid, _name(pid), launch, run_dir)
            else:
                continue
        except (OSError, ValueError):
            continue  # ended meanwhile, or not ours to read
        if match(proc):
            found.append(proc)
    return found


def of_launch(launch: str) -> Callable[[Proc], bool]:
    return lambda proc: proc.launch == launch


def of_run_dir(run_dir: str, but: str = "") -> Callable[[Proc], bool]:
    real = os.path.realpath(run_dir)
    return lambda proc: proc.launch != but and os.path.realpath(proc.run_dir or "/") == real


def describe(procs: Sequence[Proc]) -> str:
    counts = Counter(proc.name for proc in procs)
    return ", ".join(name if n == 1 else f"{n}x {name}" for name, n in counts.most_common())


def _signal(procs: Sequence[Proc], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)


Sessions = dict[int, tuple[str, str]]


def _wait_gone(match: Callable[[Proc], bool], seconds: float, sessions: Sessions) -> list[Proc]:
    end = time.monotonic() + seconds
    left = launch_processes(match, sessions)
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = launch_processes(match, sessions)
    return left


def stop(
    match: Callable[[Proc], bool], settle_s: float, grace_s: float, sessions: Sessions
) -> tuple[list[Proc], int]:
    """End every matching process: what was still there after ``settle_s`` (the ones this had
    to stop) and how many of them needed SIGKILL (those left ``grace_s`` after SIGTERM)."""
    left = _wait_gone(match, settle_s, sessions)
    stopped: dict[int, Proc] = {proc.pid: proc for proc in left}
    killed: set[int] = set()
    end = time.monotonic() + grace_s
    while left and time.monotonic() < end:  # a dying raylet may still start a worker: rescan
        deaf = [proc for proc in left if blocks_sigterm(proc.pid)]
        _signal(deaf, signal.SIGKILL)
        killed.update(proc.pid for proc in deaf)
        _signal([proc for proc in left if proc not in deaf], signal.SIGTERM)
        left = _wait_gone(match, min(1.0, max(0.0, end - time.monotonic())), sessions)
        stopped.update((proc.pid, proc) for proc in left)
    for _ in range(20):
        if not left:
            break
        _signal(left, signal.SIGKILL)
        killed.update(proc.pid for proc in left)
        left = _wait_gone(match, 0.5, sessions)
        stopped.update((proc.pid, proc) for proc in left)
    return list(stopped.values()), len(killed)


def exec_blocked(argv: Sequence[str]) -> None:
    """Become ``argv`` with SIGTERM blocked (inherited by every process it starts) in a session
    of its own: each ``ray start`` of slurm/multi_node.sbatch, so that its daemons and workers
    live through a SIGTERM to every process of the job (the launcher gives verl's driver the same
    mask and session itself: launch/supervise.py)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with contextlib.suppress(OSError):
        os.setsid()  # fails only for a process group leader (slurmstepd's tasks): kept as is
    os.execvp(argv[0], list(argv))


EXEC_USAGE = (
    "usage: python -m verl_gsm8k.launch.reap exec [--] COMMAND [ARG ...]\n"
    "runs COMMAND with SIGTERM blocked in a session of its own (multi_node.sbatch's ray start)"
)


ENV_RAY_OF_JOB = "GSM8K_RAY_OF_SLURM_JOB"


def slurm_ray_groups(job: str) -> set[int]:
    """The process groups of Slurm job ``job``'s Ray on this machine: each led by a ``ray start``
    that carries ENV_RAY_OF_JOB=job (the srun clients that started them carry it too, and lead
    no group). slurmstepd starts each task as a process group leader, which ``exec``'s setsid
    cannot change; every process Ray starts stays in that group."""
    found = set()
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            with contextlib.suppress(OSError):
                marked = launch_environ(pid, (ENV_RAY_OF_JOB,)).get(ENV_RAY_OF_JOB)
                if marked == job and os.getpgid(pid) == pid:
                    found.add(pid)
    return found


def stop_slurm_ray(job: str, seconds: float = 10.0) -> int:
    """SIGKILL every process of Slurm job ``job``'s Ray on this machine (SIGTERM is blocked
    there), rescanning until none is left (a raylet may still start a worker), ``seconds`` at
    most; one line saying what was stopped; 1 when some could not be."""
    groups, uid = slurm_ray_groups(job), os.getuid()
    stopped: dict[int, Proc] = {}
    end = time.monotonic() + seconds
    while True:
        left = []
        for entry in PROC.iterdir():
            with contextlib.suppress(OSError, ValueError):
                pid = int(entry.name) if entry.name.isdigit() else 0
                ours = pid and os.getpgid(pid) in groups and entry.stat().st_uid == uid
                if ours and not _zombie(pid):
                    left.append(Proc(pid, _name(pid), job, ""))
        if not left or time.monotonic() > end:
            break
        stopped.update((proc.pid, proc) for proc in left)
        _signal(left, signal.SIGKILL)
        time.sleep(0.2)
    host = socket.gethostname().split(".")[0]
    done = describe(list(stopped.values())) or "none left"
    print(f"slurm: Ray of job {job} on {host}: {len(stopped)} processes stopped ({done})"
          + (f"; {len(left)} could not be" if left else ""), flush=True)  # fmt: skip
    return 1 if left else 0


def check_run_dir(run_dir: str, wait_s: float, but: str = "") -> int:
    """0 when no process of an earlier launch into ``run_dir`` runs (after waiting ``wait_s``
    seconds for them to end); else 2, said in one line."""
    match = of_run_dir(run_dir, but)
    left = _wait_gone(match, wait_s, read_session(run_dir))
    if not left:
        return 0
    pids = " ".join(str(proc.pid) for proc in left[:8]) + (" ..." if len(left) > 8 else "")
    launches = sorted({proc.launch for proc in left})
    print(f"recipe: {run_dir} is in use: {len(left)} processes of an earlier launch "
          f"into it still run ({describe(left)}; pids {pids}; launch {', '.join(launches)}), "
          f"though it holds no lock: a launch beside them could write over their "
          f"checkpoints; stop them (python -m verl_gsm8k.launch.reap stop --run-dir "
          f"{run_dir!r}) or wait for them (LOCK_WAIT_S)", file=sys.stderr, flush=True)  # fmt: skip
    return 2


def stop_all(
    match: Callable[[Proc], bool], what: str, sessions: Sessions, settle_s: float = 3.0,
    grace_s: float = 10.0,
) -> int:  # fmt: skip
    """End every process ``match`` finds, say in one line what had to be stopped; 1 when some
    could not be."""
    stopped, killed = stop(match, settle_s, grace_s, sessions)
    left = launch_processes(match, sessions)
    if stopped:
        how = f", {killed} of them by SIGKILL" if killed else ""
        print(f"recipe: {len(stopped)} processes of {what} outlived verl and were stopped "
              f"({describe(stopped)}){how}", file=sys.stderr, flush=True)  # fmt: skip
    if left:
        pids = " ".join(str(proc.pid) for proc in left)
        print(f"recipe: {len(left)} processes of {what} could not be stopped "
              f"({describe(left)}; pids {pids})", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    return 0


def stop_launch(launch: str, run_dir: str) -> int:
    """After verl has ended: every process of launch ``launch`` still there is stopped."""
    sessions = {sid: it for sid, it in read_session(run_dir).items() if it[0] == launch}
    return stop_all(of_launch(launch), f"launch {launch}", sessions)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["exec"]:
        command = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        if not command or (argv[1:2] != ["--"] and command[0] in ("-h", "--help")):
            print(EXEC_USAGE, file=sys.stdout if command else sys.stderr)
            return 0 if command else 2
        exec_blocked(command)
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.launch.reap", description=__doc__)
    parser.add_argument("action", choices=("stop", "check"))
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--launch", help="the launch's GSM8K_LAUNCH_ID")
    which.add_argument("--run-dir", help="every launch into this run directory")
    which.add_argument(
        "--slurm-ray",
        metavar="JOB",
        help="stop: the Ray slurm/multi_node.sbatch "
        "started for Slurm job JOB on this machine (its ray start process groups)",
    )
    parser.add_argument("--session-of", default="", help="stop --launch: its run directory")
    parser.add_argument("--but", default="", help="check: a launch id left out (the caller's)")
    parser.add_argument("--settle", type=float, default=3.0, help="stop: s to end on their own")
    parser.add_argument("--grace", type=float, default=10.0, help="stop: s from SIGTERM to KILL")
    parser.add_argument("--wait", type=float, default=0.0, help="check: s to wait for them")
    args = parser.parse_args(argv)
    if args.action == "check":
        if not args.run_dir:
            parser.error("check takes --run-dir")
        return check_run_dir(args.run_dir, args.wait, args.but)
    if args.slurm_ray:
        return stop_slurm_ray(args.slurm_ray)
    match = of_launch(args.launch) if args.launch else of_run_dir(args.run_dir, args.but)
    sessions = read_session(args.session_of or args.run_dir or "")
    if args.launch:  # the session written by this launch, not an earlier one's
        sessions = {sid: it for sid, it in sessions.items() if it[0] == args.launch}
    what = f"launch {args.launch}" if args.launch else f"launches into {args.run_dir}"
    return stop_all(match, what, sessions, args.settle, args.grace)


if __name__ == "__main__":
    sys.exit(main())
