"""A job's deadline (verl_gsm8k/guard/deadline.py): when the trainer stops before a step that would
not end in time, what the launch says of the time left, and how the launcher reports the stop."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from helpers import ROOT

from verl_gsm8k.common.run_dir import DEADLINE_FILE, EXIT_PREEMPTED
from verl_gsm8k.guard.deadline import (
    MARGIN_S,
    Timings,
    must_stop,
    plan,
    read_deadline,
    record_stop,
    stamp_time,
)
from verl_gsm8k.launch.outcome import verdict

STAMP = "20261126T100000Z"


def test_one_more_step_and_its_save_must_end_before_the_deadline():
    timings = Timings(step_s=60.0, save_s=20.0, val_s=30.0)
    needed = 60 + 2 * 20 + 30  # this step's save and validation, the next step and its save
    assert timings.next_step_and_save() == needed
    assert not must_stop(0.0, needed + MARGIN_S + 1, timings)
    assert must_stop(0.0, needed + MARGIN_S - 1, timings)
    assert not must_stop(0.0, None, timings)  # no deadline: never
    assert not must_stop(0.0, 1.0, Timings())  # nothing measured yet: the first step runs
    # before the first save, a save is taken to take a step's time
    assert Timings(step_s=10.0).next_step_and_save() == 30.0


def test_the_slowest_times_are_kept_across_launches(tmp_path: Path):
    timings = Timings.read(tmp_path)
    assert timings == Timings()
    for seconds in (5.0, 9.0, 7.0):
        timings.slowest("step_s", seconds)
    timings.slowest("save_s", 3.0)
    timings.write(tmp_path)
    assert Timings.read(tmp_path) == Timings(step_s=9.0, save_s=3.0)
    assert stamp_time(STAMP) == 1795687200.0 and stamp_time("nonsense") is None


def test_a_time_limit_shorter_than_start_up_a_step_and_a_save_is_one_line(tmp_path: Path):
    status, line = plan(tmp_path, 1000.0, 0.0)
    assert status == 0 and "nothing measured in this run directory yet" in line
    Timings(step_s=100.0, save_s=30.0, start_s=200.0).write(tmp_path)
    needed = 200 + 100 + 2 * 30 + MARGIN_S
    status, line = plan(tmp_path, needed - 1, 0.0)
    assert status == 2 and "shorter than start-up + one step + a save" in line
    assert "start-up 200 s, step 100 s, save 30.0 s" in line and "sbatch --time" in line
    status, line = plan(tmp_path, needed + 1, 0.0)
    assert status == 0 and "saves and stops before a step that would not end in time" in line


def test_the_cli_writes_the_deadline_only_when_it_fits(tmp_path: Path):
    Timings(step_s=100.0, save_s=30.0, start_s=200.0).write(tmp_path)
    command = [sys.executable, "-m", "verl_gsm8k.guard.deadline", str(tmp_path), "--end"]
    short = subprocess.run([*command, str(time.time() + 60)], capture_output=True, text=True,
                           cwd=ROOT)  # fmt: skip
    assert short.returncode == 2 and short.stderr.count("\n") == 1, short.stderr
    assert not (tmp_path / DEADLINE_FILE).exists()
    end = time.time() + 3600
    ok = subprocess.run([*command, str(end)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "recipe: deadline: the job ends at" in ok.stdout
    assert read_deadline(tmp_path) == round(end)


def test_a_deadline_stop_of_this_launch_is_exit_5_with_its_line(tmp_path: Path):
    record_stop(tmp_path, 7, "20261125T000000Z", 1000.0, 95.0)  # another launch's
    assert verdict(tmp_path, STAMP, 0, stopped=False) == (0, [])
    record_stop(tmp_path, 7, STAMP, 1000.0, 95.0)
    status, (line,) = verdict(tmp_path, STAMP, 0, stopped=False)
    assert status == EXIT_PREEMPTED
    assert "stopped before the job's end after saving step 7" in line and "95.0 s" in line
