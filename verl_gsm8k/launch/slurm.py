"""The Slurm job the launcher runs in: its end, KillWait, what stopped it, the requeue."""

import re
import subprocess
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from verl_gsm8k.common.run_dir import read_stamp, tracked_step

Run = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def job_end(env: Mapping[str, str], run: Run = _run) -> int | None:
    """The job's end (epoch s): SLURM_JOB_END_TIME, else squeue's %e; None without one."""
    job, given = env.get("SLURM_JOB_ID"), env.get("SLURM_JOB_END_TIME", "")
    if not job:
        return None
    if given.isdigit() and int(given) > 0:
        return int(given)
    end = (run(["squeue", "-h", "-j", job, "-o", "%e"]).split() or [""])[0]
    try:  # NONE, Unknown: no limit; squeue prints local time
        return int(datetime.fromisoformat(end).timestamp()) if end[:2].isdigit() else None
    except ValueError:
        return None


def job_fields(job: str, run: Run = _run) -> dict[str, str]:
    words = run(["scontrol", "show", "job", "-o", job]).split()
    return dict(word.split("=", 1) for word in words if "=" in word)


def kill_wait(run: Run = _run) -> int | None:
    found = re.search(r"^KillWait\s*=\s*(\d+)", run(["scontrol", "show", "config"]), re.M)
    return int(found.group(1)) if found else None


def ended_by_slurm(env: Mapping[str, str], run: Run = _run) -> str | None:
    """ "requeue" (its restart count went up), "cancel" (scancel), or None."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    fields, count = job_fields(job, run), env.get("SLURM_RESTART_COUNT", "")
    restarts = fields.get("Restarts", "")
    if restarts.isdigit() and int(restarts) > (int(count) if count.isdigit() else 0):
        return "requeue"
    return "cancel" if fields.get("JobState", "").startswith("CANCELLED") else None


def kill_wait_line(env: Mapping[str, str], needs: float | None, run: Run = _run) -> str | None:
    """Whether a stop measured here fits in KillWait; None outside a job."""
    job = env.get("SLURM_JOB_ID")
    wait = kill_wait(run) if job else None
    if wait is None:
        return None
    partition = job_fields(job, run).get("Partition", "")
    shown = run(["scontrol", "show", "partition", "-o", partition]) if partition else ""
    grace = int((re.findall(r"\bGraceTime=(\d+)", shown) or ["0"])[0])
    extra = f"; a preemption adds GraceTime {grace} s" if grace else ""
    said = (f"recipe: Slurm: a requeue or preemption of job {job} leaves {wait} s from its "
            f"SIGTERM to its SIGKILL (KillWait{extra})")  # fmt: skip
    if needs is None:
        return said + ": no step measured in this run yet to compare"
    if needs <= wait:
        return said + f": a stop needs {needs:.0f} s measured here, it fits"
    return said + (f": a stop needs {needs:.0f} s measured here, it does NOT fit: a requeue "
                   "would lose the step in flight (the time limit is covered: the sbatch's "
                   "--signal=B:TERM@120)")  # fmt: skip


def requeue_if_stopped(
    status: int, stamp: str, run_dir: Path, env: Mapping[str, str], say, run: Run = _run
) -> None:
    """SLURM_REQUEUE_ON_STOP=1: a launch that stopped (5) after saving requeues its job."""
    job = env.get("SLURM_JOB_ID")
    if status != 5 or env.get("SLURM_REQUEUE_ON_STOP") != "1" or not job:
        return
    step = tracked_step(run_dir)
    resumes = f"step {step}" if step is not None else "the start"
    ended = ended_by_slurm(env, run)  # Slurm refuses a second requeue
    if ended == "requeue":
        restarts = job_fields(job, run).get("Restarts", "?")
        return say(f"recipe: Slurm requeued job {job} itself (restart {restarts}: a preemption "
                   f"or scontrol requeue): it resumes from {resumes}")  # fmt: skip
    if ended == "cancel":
        return say(f"recipe: Slurm job {job} was cancelled (scancel): not requeued; the same "
                   f"command resumes from {resumes}")  # fmt: skip
    if step is None or read_stamp(run_dir, step) != stamp:
        return say(f"recipe: Slurm job {job} not requeued: this launch saved no step (start-up, "
                   "a step and a save did not fit before it stopped); resubmit with more time "
                   "(sbatch --time)", err=True)  # fmt: skip
    count = env.get("SLURM_RESTART_COUNT") or "0"
    say(f"recipe: requeueing Slurm job {job} (restart {count}): it resumes from step {step}")
    try:
        failed = subprocess.run(["scontrol", "requeue", job]).returncode != 0
    except OSError:
        failed = True
    if failed:
        say(f"recipe: scontrol requeue {job} failed: resubmit the same command to resume", err=True)
