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
still run, after waiting ``--wait`` seconds for them to end: they hold no lock (only the launcher
holds it) and could still write checkpoints. Those of a launch whose launcher has ended (a
SIGKILL of it: verl's driver dies with it, launch/supervise.py; Ray's agents may linger) are
not waited for: they are stopped, said in one line, and the relaunch goes on.

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
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_gsm8k.common import procs
from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR, launcher_ended
from verl_gsm8k.common.run_dir import session_path


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str
    launch: str
    run_dir: str


Sessions = dict[int, tuple[str, str]]


def read_session(run_dir: str) -> Sessions:
    """The session of the last launch into ``run_dir`` (launch/supervise.py ``start`` wrote it),
    as ``{session id: (launch id, run dir)}``; empty when there is none."""
    try:
        sid, launch = session_path(Path(run_dir)).read_text(encoding="utf-8").split()[:2]
        return {int(sid): (launch, run_dir)}
    except (OSError, ValueError):
        return {}


def launch_processes(match: Callable[[Proc], bool], sessions: Sessions | None = None) -> list[Proc]:
    """This user's live processes that carry a launch's variables, or are in the session of one
    of ``sessions``, and ``match``. (Ray retitles its workers, setproctitle, which may overwrite
    what /proc shows of their environment; none of them leaves verl's session.)"""
    mine = procs.session_of(0)
    if sessions and mine in sessions:  # a session id used again: ours, never a survivor
        sessions = {sid: it for sid, it in sessions.items() if sid != mine}
    found = []
    for process in procs.ours():
        pid = process.pid
        env = procs.environ(pid, (ENV_LAUNCH, ENV_RUN_DIR))
        if env is None:
            continue  # ended meanwhile, or not ours to read
        if ENV_LAUNCH in env:
            proc = Proc(pid, procs.name(pid), env[ENV_LAUNCH], env.get(ENV_RUN_DIR, ""))
        elif sessions and (sid := procs.session_of(pid)) in sessions:
            launch, run_dir = sessions[sid]  # type: ignore[index]
            proc = Proc(pid, procs.name(pid), launch, run_dir)
        else:
            continue
        if match(proc):
            found.append(proc)
    return found


def of_launch(launch: str) -> Callable[[Proc], bool]:
    return lambda proc: proc.launch == launch


def of_run_dir(run_dir: str, but: str = "") -> Callable[[Proc], bool]:
    real = os.path.realpath(run_dir)
    return lambda proc: proc.launch != but and os.path.realpath(proc.run_dir or "/") == real


def describe(found: Sequence[Proc]) -> str:
    counts = Counter(proc.name for proc in found)
    return ", ".join(name if n == 1 else f"{n}x {name}" for name, n in counts.most_common())


class Finder:
    """``launch_processes`` as common/procs.py's ``stop`` rescans it, keeping each Proc seen."""

    def __init__(self, match: Callable[[Proc], bool], sessions: Sessions) -> None:
        self.match, self.sessions = match, sessions
        self.seen: dict[int, Proc] = {}

    def __call__(self) -> list[int]:
        found = launch_processes(self.match, self.sessions)
        self.seen.update((proc.pid, proc) for proc in found)
        return [proc.pid for proc in found]

    def procs_of(self, pids: Iterable[int]) -> list[Proc]:
        return [self.seen[pid] for pid in pids if pid in self.seen]


def stop(
    match: Callable[[Proc], bool], settle_s: float, grace_s: float, sessions: Sessions
) -> tuple[list[Proc], int]:
    """End every matching process (common/procs.py's one policy): what was still there after
    ``settle_s`` (the ones this had to stop) and how many of them needed SIGKILL."""
    find = Finder(match, sessions)
    if not procs.wait_gone(find, settle_s):
        return [], 0
    seen, killed = procs.stop(find, grace_s)
    return find.procs_of(sorted(seen)), len(killed)


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
    for process in procs.ours():
        marked = (procs.environ(process.pid, (ENV_RAY_OF_JOB,)) or {}).get(ENV_RAY_OF_JOB)
        if marked == job and procs.group_of(process.pid) == process.pid:
            found.add(process.pid)
    return found


def stop_slurm_ray(job: str, seconds: float = 10.0) -> int:
    """SIGKILL every process of Slurm job ``job``'s Ray on this machine (SIGTERM is blocked
    there), rescanning until none is left (a raylet may still start a worker), ``seconds`` at
    most; one line saying what was stopped; 1 when some could not be."""
    groups, names = slurm_ray_groups(job), {}

    def find() -> list[int]:
        left = [p.pid for p in procs.ours() if procs.group_of(p.pid) in groups]
        names.update((pid, names.get(pid) or procs.name(pid)) for pid in left)
        return left

    seen, _ = procs.stop(find, 0.0, kill_rounds=max(1, int(seconds / 0.5)))
    left = find()
    host = socket.gethostname().split(".")[0]
    stopped = [Proc(pid, names[pid], job, "") for pid in sorted(seen)]
    done = describe(stopped) or "none left"
    print(f"slurm: Ray of job {job} on {host}: {len(stopped)} processes stopped ({done})"
          + (f"; {len(left)} could not be" if left else ""), flush=True)  # fmt: skip
    return 1 if left else 0


def check_run_dir(run_dir: str, wait_s: float, but: str = "") -> int:
    """0 when no process of an earlier launch into ``run_dir`` runs; else 2, said in one line.
    Those of a launch whose launcher has ended (a SIGKILL; verl's driver dies with it) are
    stopped, said in one line; the others are waited for ``wait_s`` seconds."""
    sessions, match = read_session(run_dir), of_run_dir(run_dir, but)
    orphaned = sorted({p.launch for p in launch_processes(match, sessions)
                       if launcher_ended(p.launch)})  # fmt: skip
    for launch in orphaned:
        stop_all(of_launch(launch), f"launch {launch}", launch_sessions(launch, run_dir), 0.0,
                 outlived="its launcher")  # fmt: skip
    find = Finder(match, sessions)
    left = find.procs_of(procs.wait_gone(find, wait_s))
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
    grace_s: float = 10.0, outlived: str = "verl",
) -> int:  # fmt: skip
    """End every process ``match`` finds, say in one line what had to be stopped; 1 when some
    could not be."""
    stopped, killed = stop(match, settle_s, grace_s, sessions)
    left = launch_processes(match, sessions)
    if stopped:
        how = f", {killed} of them by SIGKILL" if killed else ""
        print(f"recipe: {len(stopped)} processes of {what} outlived {outlived} and were stopped "
              f"({describe(stopped)}){how}", file=sys.stderr, flush=True)  # fmt: skip
    if left:
        pids = " ".join(str(proc.pid) for proc in left)
        print(f"recipe: {len(left)} processes of {what} could not be stopped "
              f"({describe(left)}; pids {pids})", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    return 0


def launch_sessions(launch: str, run_dir: str) -> Sessions:
    """The session RUN_DIR/.launch.session names, if launch ``launch`` wrote it."""
    return {sid: it for sid, it in read_session(run_dir).items() if it[0] == launch}


def stop_launch(launch: str, run_dir: str) -> int:
    """After verl has ended: every process of launch ``launch`` still there is stopped."""
    return stop_all(of_launch(launch), f"launch {launch}", launch_sessions(launch, run_dir))


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
        sessions = launch_sessions(args.launch, args.session_of)
    what = f"launch {args.launch}" if args.launch else f"launches into {args.run_dir}"
    return stop_all(match, what, sessions, args.settle, args.grace)


if __name__ == "__main__":
    sys.exit(main())
