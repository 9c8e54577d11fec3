"""Stopping early without losing a step, the launch's side (guard/stop.py, launch/slurm.py,
launch/save_every.py); the trainer's: tests/test_guard_trainer.py."""

import os
import time
from pathlib import Path

import pytest
from helpers import ROOT

from verl_gsm8k.common.run_dir import EXIT_PREEMPTED, write_stamp, write_tracker
from verl_gsm8k.guard import stop
from verl_gsm8k.guard.stop import MARGIN_S, RAY_JOB_ENV, RAY_WAIT_ENV, SIGTERM, Timings
from verl_gsm8k.launch import save_every
from verl_gsm8k.launch.outcome import verdict
from verl_gsm8k.launch.slurm import kill_wait_line, requeue_if_stopped
from verl_gsm8k.launch.supervise import Supervisor

CONFIG = "Configuration data as of 2026-11-28T08:00:00\nKillWait                = 30 sec\n"


def measured(run_dir: Path, **seconds: float) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    Timings(**seconds).write(run_dir)
    return run_dir


def test_timings_keep_the_slowest_and_say_what_a_stop_and_a_next_step_need(tmp_path: Path):
    timings = Timings.read(tmp_path)
    assert timings == Timings() and timings.stop_needs() is None and timings.next_step() is None
    for seconds in (5.0, 9.0, 7.0):
        timings.slowest("step_s", seconds)
    timings.write(tmp_path)
    assert Timings.read(tmp_path) == Timings(step_s=9.0)
    assert Timings.read(tmp_path).next_step() == 27.0  # before the first save: a step's time
    (tmp_path / "timings.json").write_text('{"step_s": "soon", "save_s": 3}')  # not ours
    assert Timings.read(tmp_path) == Timings(save_s=3.0)
    timings = Timings(step_s=60.0, save_s=20.0, val_s=30.0)
    assert timings.stop_needs() == 60 + 30 + 20 + MARGIN_S  # a whole step, its validation, save
    needed = 60 + 2 * 20 + 30  # this step's save and validation, the next step, its save
    assert timings.next_step() == needed
    assert not stop.must_stop(0.0, needed + MARGIN_S + 1, timings)
    assert stop.must_stop(0.0, needed + MARGIN_S - 1, timings)
    assert not stop.must_stop(0.0, None, timings) and not stop.must_stop(0.0, 1.0, Timings())


def test_a_time_limit_shorter_than_start_up_a_step_and_a_save_is_refused(tmp_path: Path):
    status, line = stop.fits(tmp_path, 1000.0, 0.0)
    assert status == 0 and "nothing measured in this run directory yet" in line
    measured(tmp_path, step_s=100.0, save_s=30.0, start_s=200.0)
    needed = 200 + 100 + 2 * 30 + MARGIN_S
    status, line = stop.fits(tmp_path, needed - 1, 0.0)
    assert status == 2 and "shorter than start-up + one step + a save" in line
    assert "start-up 200 s, step 100 s, save 30.0 s" in line and "sbatch --time" in line
    status, line = stop.fits(tmp_path, needed + 1, 0.0)
    assert status == 0 and "saves and stops before a step that would not end in time" in line


def test_the_grace_is_what_a_stop_needs_a_users_kept_and_a_short_one_warned(tmp_path: Path):
    default = "recipe: STOP_GRACE_S=30 s (the default; "
    assert stop.grace(Timings(), {}) == (
        30, [f"{default}nothing measured in this run directory yet)"])  # fmt: skip
    assert stop.grace(Timings(step_s=5, save_s=3), {}) == (
        30, [f"{default}a stop needs 23 s: step 5 s, save 3 s, +15 s, measured in timings.json)"]
    )  # fmt: skip
    slow = Timings(step_s=66.2, save_s=20.5)
    grace_s, (line,) = stop.grace(slow, {})
    assert grace_s == 102 and line.startswith("recipe: STOP_GRACE_S=102 s, what a stop needs ")
    grace_s, (line,) = stop.grace(slow, {"STOP_GRACE_S": "40"})
    assert grace_s == 40 and line.startswith("recipe: warning: STOP_GRACE_S=40 s is shorter")
    assert stop.grace(slow, {"STOP_GRACE_S": "600"}) == (600, [])
    for key in ("STOP_GRACE_S", RAY_WAIT_ENV):
        with pytest.raises(ValueError, match=f"recipe: {key}='soon' is not a number of seconds"):
            stop.grace(slow, {key: "soon", RAY_JOB_ENV: "{}"})
    slow = Timings(step_s=66, save_s=20)
    *_, line = stop.grace(slow, {RAY_JOB_ENV: "{}"})[1]  # a Ray job: SIGKILL 3 s after SIGTERM
    assert line.startswith(f"recipe: warning: a Ray job: `ray job stop` sends SIGKILL "
                           f"{RAY_WAIT_ENV}=3 s after its SIGTERM")  # fmt: skip
    assert f"start the Ray head with {RAY_WAIT_ENV}=101 in its environment" in line
    for env in ({RAY_JOB_ENV: "{}", RAY_WAIT_ENV: "300"}, {RAY_WAIT_ENV: "1"}):
        assert not any("Ray job" in line for line in stop.grace(slow, env)[1])


def test_one_stop_request_its_deadline_and_why_and_the_exit_it_gives(tmp_path: Path):
    stamp = "20261126T100000Z"
    assert stop.read_request(tmp_path) is None and verdict(tmp_path, stamp, 0) == (0, [])
    assert stop.request(tmp_path, 1000.0, stop.JOB_END) and not stop.request(tmp_path, 5.0, SIGTERM)
    assert stop.read_request(tmp_path) == (1000.0, stop.JOB_END)  # never over a request there
    write_tracker(tmp_path, 7)
    write_stamp(tmp_path, 7, stamp)
    status, (line,) = verdict(tmp_path, stamp, 0)
    assert status == EXIT_PREEMPTED
    assert line.startswith("recipe: stopped before the job's end after saving step 7 (")
    assert stop.request(tmp_path, 5.0, SIGTERM, over=True)  # the launcher's SIGTERM wins
    assert verdict(tmp_path, stamp, 0) == (0, [])  # a request verl's process wrote alone
    status, (line,) = verdict(tmp_path, "20261126T110000Z", 0, signalled=True)
    assert status == EXIT_PREEMPTED and line == ("recipe: stopped on SIGTERM before this launch "
                                                 "saved a step; the same command resumes from "
                                                 "step 7")  # fmt: skip
    assert verdict(tmp_path, stamp, 143, True) == (143, [])  # the grace ran out: not saved
    (tmp_path / "stop_requested").write_text("soon\n")
    assert stop.read_request(tmp_path)[0] > time.time() + 3000  # unreadable: save now


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
    assert kill_wait_line({}, needs, lambda argv: pytest.fail(f"ran {argv} outside a job")) is None


@pytest.mark.parametrize(
    ("job", "saved_by", "said"),
    [("Restarts=1 JobState=PENDING", None, "recipe: Slurm requeued job 7 itself (restart 1: a "
      "preemption or scontrol requeue): it resumes from the start"),
     ("Restarts=0 JobState=CANCELLED", "L", "recipe: Slurm job 7 was cancelled (scancel): not "
      "requeued; the same command resumes from step 3"),
     ("Restarts=0 JobState=RUNNING", "an earlier launch", "recipe: Slurm job 7 not requeued: "
      "this launch saved no step")],
    ids=["requeued by Slurm", "scancel", "nothing saved"],
)  # fmt: skip
def test_after_a_stop_the_last_line_says_what_stopped_the_job(tmp_path, job, saved_by, said):
    if saved_by:
        write_tracker(tmp_path, 3)
        write_stamp(tmp_path, 3, saved_by)
    lines: list[str] = []
    env = {"SLURM_JOB_ID": "7", "SLURM_REQUEUE_ON_STOP": "1", "SLURM_RESTART_COUNT": "0"}
    requeue_if_stopped(5, "L", tmp_path, env, lambda line, err=False: lines.append(line),
                       scontrol(f"Partition=debug {job}"))  # fmt: skip
    assert len(lines) == 1 and lines[0].startswith(said), lines


KILL_WAIT = "within 25 s: 5 s before Slurm's SIGKILL, KillWait 30 s after its {} of job 7"


@pytest.mark.parametrize(
    ("state", "within"),
    [("JobState=COMPLETING Restarts=1", KILL_WAIT.format("requeue")),
     ("JobState=CANCELLED Restarts=0", KILL_WAIT.format("cancel")),
     ("JobState=RUNNING Restarts=0", "5 s before Slurm job 7 ends")],
    ids=["requeue", "scancel", "time limit"],
)  # fmt: skip
def test_a_sigterm_from_slurms_requeue_or_scancel_gets_killwait_not_the_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, within: str
):
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 3600))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"scontrol": f'case "$2" in config) printf "%s" "{CONFIG}";; '
                                   f'job) echo "JobId=7 Partition=debug {state}";; esac',
                       "squeue": f"echo {end}"}.items():  # fmt: skip
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    said: list[str] = []
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}
    Supervisor(tmp_path, 30, env, lambda line, err=False: said.append(line)).request_stop()
    (line,) = said
    assert line.startswith("recipe: SIGTERM: the trainer saves the step in flight and stops (")
    assert f"{within}; STOP_GRACE_S sets it" in line, line
    deadline, why = stop.read_request(tmp_path)
    left = deadline - time.time()
    assert why == SIGTERM and ((20 < left <= 26) if "KillWait" in within else 3500 < left < 3600)


@pytest.mark.parametrize(
    ("save_s", "minutes"), [(18.0, 10.0), (90.0, 50.0), (0.05, save_every.MIN_MIN)]
)  # 18 s is 3 % of 10 min; a CPU's tiny save: the floor
def test_time_saves_take_at_most_3_percent_of_the_run(tmp_path: Path, save_s, minutes):
    got, line = save_every.choose(measured(tmp_path / "run", step_s=60.0, save_s=save_s), "auto")
    assert got == minutes and f"each {minutes:g} min (SAVE_EVERY_MIN=auto: a save takes " in line
    assert save_every.choose(tmp_path / "new", "auto")[0] == save_every.FIRST_MIN
    said = "recipe: a time save after the first step past each 7.5 min (SAVE_EVERY_MIN)"
    assert save_every.choose(tmp_path / "run", "7.5") == (7.5, said)
    minutes, line = save_every.choose(tmp_path / "run", "0")
    assert minutes == 0 and "no time saves" in line


def test_the_launch_passes_the_job_end_and_the_time_saves_to_the_trainer(tmp_path: Path):
    from verl_gsm8k.launch.cli import Exit, plan_stop
    from verl_gsm8k.launch.plan import recipe_plan

    recipe = ROOT / "recipes" / "ppo_qwen2.5-0.5b_gsm8k.sh"
    run_dir = measured(tmp_path / "runs" / "ppo_qwen2.5-0.5b_gsm8k", step_s=60.0, save_s=18.0,
                       start_s=100.0)  # fmt: skip
    env = {"HOME": str(tmp_path), "RUNS_ROOT": str(tmp_path / "runs"), "SLURM_JOB_ID": "7",
           "PATH": "/nonexistent"}  # fmt: skip
    end = int(time.time()) + 60
    plan = recipe_plan(recipe, dict(env, SLURM_JOB_END_TIME=str(end)), gpu=True)
    assert plan.run_dir == run_dir
    with pytest.raises(Exit) as refused:
        plan_stop(plan)
    assert refused.value.code == 2
    plan = recipe_plan(recipe, dict(env, SLURM_JOB_END_TIME=str(end + 3600)), gpu=True)
    assert plan_stop(plan) == (30, {"GSM8K_JOB_END": str(end + 3600)})
    assert "gsm8k_guard.save_every_min=10" in plan.all_overrides([])
    assert plan.save_every_line.startswith("recipe: a time save after the first step past each "
                                           "10 min (SAVE_EVERY_MIN=auto: a save takes 18 s "
                                           "here")  # fmt: skip
