"""The Slurm job a launch runs in: its end (the trainer's deadline, a stop's grace) and, after a
stop, its requeue (docs/slurm.md, "Time limits").
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from verl_gsm8k.common.run_dir import read_stamp, tracked_step


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def job_end(env: Mapping[str, str], run: Callable[[list[str]], str] = _run) -> int | None:
    """The end of the Slurm job (epoch seconds), or None: SLURM_JOB_END_TIME where Slurm sets it
    (23.02 and later), else squeue's end time (%e), which a preemption's GraceTime and
    `scontrol update TimeLimit` move. None outside a job or without a time limit."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    given = env.get("SLURM_JOB_END_TIME", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    lines = run(["squeue", "-h", "-j", job, "-o", "%e"]).splitlines()
    end = lines[0].strip() if lines else ""
    if not re.match(r"\d{4}-\d{2}-\d{2}T", end):  # NONE, Unknown: no limit
        return None
    try:
        return int(datetime.fromisoformat(end).timestamp())  # squeue prints local time
    except ValueError:
        return None


def job_fields(job: str, run: Callable[[list[str]], str] = _run) -> dict[str, str]:
    """``scontrol show job -o JOB`` as {field: value} (values with spaces cut at the first)."""
    pairs = (word.partition("=") for word in run(["scontrol", "show", "job", "-o", job]).split())
    return {name: value for name, sep, value in pairs if sep}


def kill_wait(run: Callable[[list[str]], str] = _run) -> int | None:
    """Slurm's KillWait: the seconds from its SIGTERM to every process of a job it ends early
    (a requeue, a preemption, scancel) to its SIGKILL; None when Slurm does not say."""
    found = re.search(r"^KillWait\s*=\s*(\d+)", run(["scontrol", "show", "config"]), re.M)
    return int(found.group(1)) if found else None


def ended_by_slurm(env: Mapping[str, str], run: Callable[[list[str]], str] = _run) -> str | None:
    """What Slurm is doing to this launch's job, asked when its SIGTERM arrives: "requeue" (its
    restart count went up: `scontrol requeue`, a preemption), "cancel" (scancel), or None (the
    job runs on: the time limit's own signal, a SIGTERM from elsewhere)."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    fields = job_fields(job, run)
    restarts = int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0
    count = env.get("SLURM_RESTART_COUNT") or "0"
    if restarts > int(count if count.isdigit() else 0):
        return "requeue"
    if fields.get("JobState", "").startswith("CANCELLED"):
        return "cancel"
    return None


def kill_wait_line(
    env: Mapping[str, str], needs: float | None, run: Callable[[list[str]], str] = _run
) -> str | None:
    """Under Slurm, one line: the seconds a requeue or a preemption leaves between its SIGTERM to
    every process of the job and its SIGKILL (KillWait; a preemption adds the partition's
    GraceTime), and whether a stop (a step and its save, ``needs`` measured in this run) fits in
    them. None outside a job or when Slurm does not say."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    kill_wait_s = kill_wait(run)
    if kill_wait_s is None:
        return None
    partition = job_fields(job, run).get("Partition", "")
    shown = run(["scontrol", "show", "partition", "-o", partition]) if partition else ""
    found = re.search(r"\bGraceTime=(\d+)", shown)
    grace = int(found.group(1)) if found else 0
    extra = f"; a preemption adds GraceTime {grace} s" if grace else ""
    said = (f"recipe: Slurm: a requeue or preemption of job {job} leaves {kill_wait_s} s from its "
            f"SIGTERM to its SIGKILL (KillWait{extra})")  # fmt: skip
    if needs is None:
        return said + ": no step measured in this run yet to compare"
    if needs <= kill_wait_s:
        return said + f": a stop needs {needs:.0f} s measured here, it fits"
    return said + (f": a stop needs {needs:.0f} s measured here, it does NOT fit: a requeue "
                   "would lose the step in flight (the time limit is covered: the sbatch's "
                   "--signal=B:TERM@120)")  # fmt: skip


def requeue_if_stopped(
    status: int, stamp: str, run_dir: Path, env: Mapping[str, str], say,
    run: Callable[[list[str]], str] = _run,
) -> None:  # fmt: skip
    """Under slurm/one_node.sbatch (SLURM_REQUEUE_ON_STOP=1): a launch that stopped before the
    end of the run (exit 5) and saved a step puts its job back in the queue, so that the same job
    resumes until the run ends. A launch that saved nothing is not requeued: the next one would
    do no better. What Slurm did itself (a requeue, a preemption, scancel) is said instead."""
    job = env.get("SLURM_JOB_ID")
    if status != 5 or env.get("SLURM_REQUEUE_ON_STOP", "0") != "1" or not job:
        return
    step = tracked_step(run_dir)
    resumes = f"step {step}" if step is not None else "the start"
    # Slurm requeues it already (a preemption, `scontrol requeue`): a second requeue would fail
    # ("Job is pending execution")
    ended = ended_by_slurm(env, run)
    if ended == "requeue":
        restarts = job_fields(job, run).get("Restarts", "?")
        say(f"recipe: Slurm requeued job {job} itself (restart {restarts}: a preemption or "
            f"scontrol requeue): it resumes from {resumes}")  # fmt: skip
        return
    if ended == "cancel":
        say(f"recipe: Slurm job {job} was cancelled (scancel): not requeued; the same command "
            f"resumes from {resumes}")  # fmt: skip
        return
    if step is None or read_stamp(run_dir, step) != stamp:
        say(f"recipe: Slurm job {job} not requeued: this launch saved no step (start-up, a step "
            "and a save did not fit before it stopped); resubmit with more time (sbatch --time)",
            err=True)  # fmt: skip
        return
    count = env.get("SLURM_RESTART_COUNT") or "0"
    say(f"recipe: requeueing Slurm job {job} (restart {count}): it resumes from step {step}")
    try:
        failed = subprocess.run(["scontrol", "requeue", job], check=False).returncode != 0
    except OSError:
        failed = True
    if failed:
        say(f"recipe: scontrol requeue {job} failed: resubmit the same command to resume",
            err=True)  # fmt: skip
