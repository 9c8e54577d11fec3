"""What the launcher reads of its Slurm job (verl_gsm8k/launch/slurm.py), with scontrol's answers
stood in: whether a stop fits in KillWait, said at launch, and after a stop, what stopped the job
(Slurm's own requeue, scancel, the launcher's requeue). The same on a real Slurm:
tests/test_slurm_nodes_cpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_gsm8k.common.run_dir import write_stamp, write_tracker
from verl_gsm8k.launch.slurm import kill_wait_line, requeue_if_stopped

CONFIG = "Configuration data as of 2026-11-28T08:00:00\nKillWait                = 30 sec\n"


def scontrol(job: str = "Partition=debug Restarts=0 JobState=RUNNING", partition: str = ""):
    answers = {"config": CONFIG, "job": job, "partition": partition}
    return lambda argv: answers[argv[2]]


@pytest.mark.parametrize(
    ("needs", "ends"),
    [(45.0, "a stop needs 45 s measured here, it does NOT fit: a requeue would lose the step in "
      "flight (the time limit is covered: the sbatch's --signal=B:TERM@120)"),
     (20.0, "a stop needs 20 s measured here, it fits"),
     (None, "no step measured in this run yet to compare")],
)  # fmt: skip
def test_kill_wait_is_compared_with_what_a_stop_needs(needs, ends):
    line = kill_wait_line({"SLURM_JOB_ID": "7"}, needs, scontrol(partition="GraceTime=60"))
    head = "recipe: Slurm: a requeue or preemption of job 7 leaves 30 s from its SIGTERM to its"
    assert line == f"{head} SIGKILL (KillWait; a preemption adds GraceTime 60 s): {ends}"
    outside = kill_wait_line({}, needs, lambda argv: pytest.fail(f"ran {argv} outside a job"))
    assert outside is None  # and every launch outside Slurm starts no scontrol


def stopped(tmp_path: Path, job: str, saved_by: str | None, restarts: str = "0") -> list[str]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if saved_by:
        write_tracker(run_dir, 3)
        write_stamp(run_dir, 3, saved_by)
    said: list[str] = []
    env = {"SLURM_JOB_ID": "7", "SLURM_REQUEUE_ON_STOP": "1", "SLURM_RESTART_COUNT": restarts}
    requeue_if_stopped(5, "L", run_dir, env, lambda line, err=False: said.append(line),
                       scontrol(job))  # fmt: skip
    return said


def test_a_requeue_by_slurm_is_said_even_when_this_launch_saved_nothing(tmp_path: Path):
    said = stopped(tmp_path, "Partition=debug Restarts=1 JobState=PENDING", None)
    assert said == ["recipe: Slurm requeued job 7 itself (restart 1: a preemption or scontrol "
                    "requeue): it resumes from the start"]  # fmt: skip


def test_a_cancelled_job_is_said_so_not_told_to_ask_for_more_time(tmp_path: Path):
    said = stopped(tmp_path, "Partition=debug Restarts=0 JobState=CANCELLED", "L")
    assert said == ["recipe: Slurm job 7 was cancelled (scancel): not requeued; the same command "
                    "resumes from step 3"]  # fmt: skip


def test_a_launch_that_saved_nothing_is_not_requeued(tmp_path: Path):
    said = stopped(tmp_path, "Partition=debug Restarts=0 JobState=RUNNING", "an earlier launch")
    assert said and "not requeued: this launch saved no step" in said[0]


@pytest.mark.parametrize(
    ("state", "within"),
    [("JobState=COMPLETING Restarts=1", "within 25 s: 5 s before Slurm's SIGKILL, KillWait 30 s "
      "after its requeue of job 7; STOP_GRACE_S sets it"),
     ("JobState=CANCELLED Restarts=0", "within 25 s: 5 s before Slurm's SIGKILL, KillWait 30 s "
      "after its cancel of job 7; STOP_GRACE_S sets it"),
     ("JobState=RUNNING Restarts=0", "5 s before Slurm job 7 ends; STOP_GRACE_S sets it")],
    ids=["requeue", "scancel", "time limit"],
)  # fmt: skip
def test_a_sigterm_from_slurms_requeue_or_scancel_gets_killwait_not_the_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, within: str
):
    """A requeue's or scancel's SIGKILL comes KillWait after its SIGTERM, whatever the time
    limit: the launcher's grace, and its line, say so (scontrol and squeue stood in on PATH)."""
    import time

    from verl_gsm8k.launch.supervise import Supervisor

    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 3600))
    answers = {"scontrol": f'case "$2" in config) printf "%s" "{CONFIG}";; '
                           f'job) echo "JobId=7 Partition=debug {state}";; esac',
               "squeue": f"echo {end}"}  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in answers.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    said: list[str] = []
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}
    supervisor = Supervisor(tmp_path, 30, False, env, lambda line, err=False: said.append(line))
    supervisor.request_stop()
    (line,) = said
    assert line.startswith("recipe: SIGTERM: the trainer saves the step in flight and stops (")
    assert within in line, line
    left = float((tmp_path / "stop_requested").read_text()) - time.time()
    assert (20 < left <= 26) if "KillWait" in within else (3500 < left < 3600), left
