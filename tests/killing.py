"""Kill a real recipe launch at a chosen moment: the launcher, in a session of its own, and every
process it started (also those in the session verl's driver gets, or re-parented to init), as a
scheduler or an out-of-memory killer would; or SIGTERM to every one at once, as Slurm does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from helpers import ROOT


@dataclass
class Running:
    process: subprocess.Popen
    log: Path
    started: float
    sessions: set[int] = field(default_factory=set)  # every session seen under the launcher

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start(recipe: str, env: dict[str, str], log: Path, *args: str) -> Running:
    with open(log, "w") as handle:  # the child writes it
        process = subprocess.Popen(["bash", str(ROOT / "recipes" / f"{recipe}.sh"), *args],
                                   cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    return Running(process, log, time.monotonic())


def wait_until(what: str, ready: Callable[[], bool], running: Running, timeout: float) -> float:
    """Poll ``ready``; the seconds since the launch started when it held."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():
            return time.monotonic() - running.started
        if running.process.poll() is not None:
            raise AssertionError(f"the launch ended before {what}:\n{running.output()[-6000:]}")
        time.sleep(0.05)
    kill_all(running)
    raise AssertionError(f"no {what} after {timeout} s:\n{running.output()[-6000:]}")


def session(running: Running) -> list[psutil.Process]:
    """Every live process of the launch's sessions: the launcher's and each one a process
    under it is in (verl's driver gets one), also re-parented or out of their group."""
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(running.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                running.sessions.add(os.getsid(proc.pid))
    running.sessions.add(running.process.pid)
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) in running.sessions and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def names(running: Running) -> list[str]:
    """The names of the launch's live processes (``VLLM::EngineCor``: vLLM retitles its own)."""
    found = []
    for proc in session(running):
        with contextlib.suppress(psutil.Error):
            found.append(proc.name())
    return found


def term_all(running: Running) -> list[psutil.Process]:
    """SIGTERM to every process of the launch at once, as Slurm's requeue sends it."""
    procs = session(running)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    return procs


def kill_all(running: Running) -> None:
    """SIGKILL to the launcher, its group and every process under it or in its sessions, again
    until none is left (a dying raylet may still start a worker)."""
    try:
        tree = psutil.Process(running.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    session(running)  # the sessions under the launcher, while it still has children
    for proc in reversed(tree):  # the workers first: the ones writing shards stop soonest
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(running.process.pid, signal.SIGKILL)
    running.process.wait(timeout=60)
    psutil.wait_procs(tree, timeout=30)
    for _ in range(20):
        if not (left := session(running)):
            break
        for proc in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(left, timeout=5)


def finish(running: Running, timeout: float) -> int:
    try:
        return running.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all(running)
        tail = running.output()[-6000:]
        raise AssertionError(f"still running after {timeout} s:\n{tail}") from None


def logged_steps(metrics_file: Path) -> set[int]:
    """Training steps logged so far in one launch's metrics file."""
    steps = set()
    with contextlib.suppress(OSError):
        for line in metrics_file.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written
                row = json.loads(line)
                if "actor/pg_loss" in row.get("data", {}):
                    steps.add(row["step"])
    return steps


def newest_metrics(run_dir: Path, after: set[Path]) -> Path | None:
    """The metrics file of a launch started after ``after`` was listed, once it exists."""
    fresh = sorted(set((run_dir / "metrics").glob("metrics-*.jsonl")) - after)
    return fresh[-1] if fresh else None
