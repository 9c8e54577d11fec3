"""Nothing of a launch outlives it: its processes (this user's, here) are found by the launch's
variables in their environment, or by the session of verl's driver (RUN_DIR/.launch.session)."""

import argparse
import contextlib
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_gsm8k.common import procs
from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR, launcher_ended
from verl_gsm8k.common.run_dir import session_path

ENV_RAY_OF_JOB = "GSM8K_RAY_OF_SLURM_JOB"
Sessions = dict[int, tuple[str, str]]  # session id -> (launch id, run dir)


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str
    launch: str
    run_dir: str


def read_session(run_dir: str, launch: str | None = None) -> Sessions:
    try:
        sid, owner = session_path(Path(run_dir)).read_text(encoding="utf-8").split()[:2]
        return {int(sid): (owner, run_dir)} if launch in (None, owner) else {}
    except (OSError, ValueError):
        return {}


def launch_processes(match: Callable[[Proc], bool], sessions: Sessions | None = None) -> list[Proc]:
    mine, found = procs.session_of(0), []
    for process in procs.ours():
        pid = process.pid
        env = procs.environ(pid, (ENV_LAUNCH, ENV_RUN_DIR))
        sid = procs.session_of(pid)
        if env is None:
            continue
        if ENV_LAUNCH in env:
            owner = env[ENV_LAUNCH], env.get(ENV_RUN_DIR, "")
        elif sessions and sid != mine and sid in sessions:  # a session id used again: ours
            owner = sessions[sid]  # type: ignore[index]
        else:
            continue
        proc = Proc(pid, procs.name(pid), *owner)
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


def _finder(match: Callable[[Proc], bool], sessions: Sessions):
    seen: dict[int, Proc] = {}

    def find() -> list[int]:
        found = launch_processes(match, sessions)
        seen.update((proc.pid, proc) for proc in found)
        return [proc.pid for proc in found]

    return find, seen


def stop(
    match: Callable[[Proc], bool], sessions: Sessions, what: str, outlived: str = "verl",
    settle_s: float = 3.0, grace_s: float = 10.0,
) -> int:  # fmt: skip
    """After ``settle_s``, procs.stop; one line on what was stopped; 1 if some are left."""
    find, seen = _finder(match, sessions)
    pids, killed = procs.stop(find, grace_s) if procs.wait_gone(find, settle_s) else (set(), ())
    stopped = [seen[pid] for pid in sorted(pids)]
    if stopped:
        how = f", {len(killed)} of them by SIGKILL" if killed else ""
        print(f"recipe: {len(stopped)} processes of {what} outlived {outlived} and were stopped "
              f"({describe(stopped)}){how}", file=sys.stderr, flush=True)  # fmt: skip
    left = launch_processes(match, sessions)
    if left:
        pids = " ".join(str(proc.pid) for proc in left)
        print(f"recipe: {len(left)} processes of {what} could not be stopped ({describe(left)}; "
              f"pids {pids})", file=sys.stderr, flush=True)  # fmt: skip
    return 1 if left else 0


def stop_launch(launch: str, run_dir: str) -> int:
    return stop(of_launch(launch), read_session(run_dir, launch), f"launch {launch}")


def check_run_dir(run_dir: str, wait_s: float, but: str = "") -> int:
    """0 when no earlier launch's process runs after ``wait_s``, else 2; orphans stopped at once."""
    sessions, match = read_session(run_dir), of_run_dir(run_dir, but)
    for launch in sorted({p.launch for p in launch_processes(match, sessions)}):
        if launcher_ended(launch):
            stop(of_launch(launch), read_session(run_dir, launch), f"launch {launch}",
                 "its launcher", settle_s=0.0)  # fmt: skip
    find, seen = _finder(match, sessions)
    left = [seen[pid] for pid in procs.wait_gone(find, wait_s)]
    if not left:
        return 0
    pids = " ".join(str(proc.pid) for proc in left[:8]) + (" ..." if len(left) > 8 else "")
    print(f"recipe: {run_dir} is in use: {len(left)} processes of an earlier launch into it "
          f"still run ({describe(left)}; pids {pids}; launch "
          f"{', '.join(sorted({p.launch for p in left}))}), though it holds no lock: a launch "
          "beside them could write over their checkpoints; stop them (python -m "
          f"verl_gsm8k.launch.reap stop --run-dir {run_dir!r}) or wait for them (LOCK_WAIT_S)",
          file=sys.stderr, flush=True)  # fmt: skip
    return 2


def slurm_ray_groups(job: str) -> set[int]:
    marked = {p.pid: procs.environ(p.pid, (ENV_RAY_OF_JOB,)) or {} for p in procs.ours()}
    return {pid for pid, env in marked.items() if env.get(ENV_RAY_OF_JOB) == job
            and procs.group_of(pid) == pid}  # fmt: skip


def stop_slurm_ray(job: str) -> int:
    """SIGKILL (SIGTERM is blocked) to ``job``'s Ray here."""
    groups, names = slurm_ray_groups(job), {}

    def find() -> list[int]:
        left = [p.pid for p in procs.ours() if procs.group_of(p.pid) in groups]
        names.update((pid, names.get(pid) or procs.name(pid)) for pid in left)
        return left

    seen, _ = procs.stop(find, 0.0)
    left = find()
    done = describe([Proc(pid, names[pid], job, "") for pid in sorted(seen)]) or "none left"
    print(f"slurm: Ray of job {job} on {socket.gethostname().split('.')[0]}: {len(seen)} "
          f"processes stopped ({done})" + (f"; {len(left)} could not be" if left else ""),
          flush=True)  # fmt: skip
    return 1 if left else 0


def exec_blocked(argv: Sequence[str]) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with contextlib.suppress(OSError):
        os.setsid()
    os.execvp(argv[0], list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["exec", "--"] and argv[2:]:
        exec_blocked(argv[2:])
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.launch.reap", description=(
        "Stop what outlives a launch. `exec -- COMMAND ...` runs COMMAND with SIGTERM blocked "
        "in a session of its own (slurm/multi_node.sbatch's ray start)."))  # fmt: skip
    parser.add_argument("action", choices=("stop",))
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-dir", help="every process of the launches into this run directory")
    which.add_argument("--slurm-ray", metavar="JOB", help="the Ray slurm/multi_node.sbatch "
                       "started for Slurm job JOB on this machine")  # fmt: skip
    args = parser.parse_args(argv)
    if args.slurm_ray:
        return stop_slurm_ray(args.slurm_ray)
    run_dir = args.run_dir
    return stop(of_run_dir(run_dir), read_session(run_dir), f"launches into {run_dir}")


if __name__ == "__main__":
    sys.exit(main())
