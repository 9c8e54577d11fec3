"""The guard's files as the launcher and pruning read them: how a launch ended (exit 4 for the
watchdog, 5 after SIGTERM), and MAX_CKPT_TO_KEEP never removing the tracked step or the best.
The trainer that writes them runs for real in test_train_cpu.py (killed, preempted, stopped)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import skip_or_fail

from verl_gsm8k.common.run_dir import (
    EXIT_PREEMPTED,
    EXIT_WATCHDOG,
    append_trip,
    write_best,
    write_stamp,
)
from verl_gsm8k.guard.prune import prune
from verl_gsm8k.launch.outcome import verdict

STAMP, OTHER = "20261125T101500Z", "20261125T090000Z"


def steps(run_dir: Path, *numbers: int) -> None:
    for n in numbers:
        (run_dir / f"global_step_{n}" / "actor").mkdir(parents=True)


def trip(step: int, launch: str, action: str = "stop") -> dict:
    message = f"watchdog: non_finite at step {step}"
    return {"launch": launch, "step": step, "rule": "non_finite", "metric": "critic/score/mean",
            "value": float("nan"), "threshold": "not finite", "action": action,
            "last_healthy_checkpoint": step - 1, "message": message}  # fmt: skip


def test_a_watchdog_stop_of_this_launch_is_exit_4_with_its_line(tmp_path: Path):
    append_trip(tmp_path, trip(3, OTHER))  # an earlier launch's trip is not this one's
    assert verdict(tmp_path, STAMP, 0, stopped=False) == (0, [])
    append_trip(tmp_path, trip(9, STAMP))
    status, lines = verdict(tmp_path, STAMP, 0, stopped=False)
    assert status == EXIT_WATCHDOG
    assert lines == ["recipe: watchdog: non_finite at step 9 (WATCHDOG=stop: step 9 was not "
                     "saved; the run stopped)"]  # fmt: skip


def test_warnings_are_counted_and_verls_status_kept(tmp_path: Path):
    append_trip(tmp_path, trip(4, STAMP, "warn"))
    append_trip(tmp_path, trip(5, STAMP, "warn"))
    status, (line,) = verdict(tmp_path, STAMP, 1, stopped=False)
    assert status == 1 and "warned 2 time(s), the run went on" in line
    assert "non_finite at step 4" in line
    assert "WATCHDOG=warn" not in line  # a warning-only rule warns under WATCHDOG=stop too


def test_sigterm_says_which_step_was_saved_or_that_none_was(tmp_path: Path):
    steps(tmp_path, 6)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("6")
    write_stamp(tmp_path, 6, OTHER)
    status, (line,) = verdict(tmp_path, STAMP, 0, stopped=True)
    assert status == EXIT_PREEMPTED and "before this launch saved a step" in line
    assert "resumes from step 6" in line
    write_stamp(tmp_path, 6, STAMP)
    status, (line,) = verdict(tmp_path, STAMP, 0, stopped=True)
    assert status == EXIT_PREEMPTED and "stopped on SIGTERM after saving step 6" in line


def test_pruning_keeps_the_newest_the_tracked_and_the_best(tmp_path: Path):
    steps(tmp_path, 2, 4, 6, 8, 10)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")  # after RESUME=disable
    write_best(tmp_path, 2, "val-core/openai/gsm8k/acc/mean@1", 0.57, STAMP)
    said = prune(tmp_path, 2)
    left = sorted(int(p.name.split("_")[-1]) for p in tmp_path.glob("global_step_*"))
    assert left == [2, 4, 8, 10], said
    assert not list(tmp_path.glob(".global_step_*"))  # nothing half-removed left behind
    assert any("keeping" in line and "global_step_2: the best" in line for line in said)
    assert any("global_step_4: latest_checkpointed_iteration.txt names it" in line for line in said)
    assert prune(tmp_path, 2, say_kept=False) == []


def test_a_watchdog_trip_is_the_launchs_exit_status_and_its_line(tmp_path: Path):
    """What the launcher says and exits with after verl exits 0 from a tripped run."""
    append_trip(tmp_path, trip(9, STAMP))
    status, lines = verdict(tmp_path, STAMP, 0, False)
    assert status == EXIT_WATCHDOG and any("non_finite at step 9" in line for line in lines)


def test_a_kill_mid_prune_leaves_nothing_a_later_prune_trips_on(tmp_path: Path):
    """SIGKILL lands between the rename of global_step_1 and its removal (the pause hook), then
    step 1 is saved again and pruned again: the leftover is cleared, not renamed onto."""
    import os
    import signal
    import time

    run = tmp_path / "run"
    steps(run, 1, 2, 3)
    (run / "global_step_1" / "actor" / "model.pt").write_bytes(b"weights")
    here = tmp_path / "paused"
    env = dict(os.environ, GSM8K_PAUSE_AT="prune:after_rename", GSM8K_PAUSE_FILE=str(here))
    proc = subprocess.Popen([sys.executable, "-m", "verl_gsm8k.guard.prune", str(run), "--keep",
                             "2"], env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while not here.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert here.exists(), "prune never reached its pause point"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    leftover = run / ".global_step_1.removing"
    assert leftover.is_dir() and not (run / "global_step_1").exists()  # killed mid-removal
    steps(run, 1)  # a resumed run saves step 1 again (RESUME=disable in the same directory)
    (run / "global_step_4" / "actor").mkdir(parents=True)
    lines = prune(run, 2)
    assert not leftover.exists()
    assert sorted(p.name for p in run.iterdir()) == ["global_step_3", "global_step_4"], lines


def test_a_full_disk_mid_save_is_one_line(tmp_path: Path):
    """A real full disk (a 256 KiB tmpfs): step 2 saved whole, step 3's torch.save fails as it
    does inside verl's checkpoint manager; the launcher's line names the disk, the step whose
    save failed, the last whole checkpoint and what one checkpoint takes (docs/reliability.md,
    "What survives what": the disk full during a save)."""
    import gc
    import shutil as sh

    import pytest
    import torch

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode:
        skip_or_fail("mounting a tmpfs needs root (CI runs as root)")
    try:
        run = mount / "run"
        steps(run, 2)
        torch.save({"w": torch.zeros(8_000)}, run / "global_step_2" / "actor" / "model.pt")
        (run / "latest_checkpointed_iteration.txt").write_text("2")
        steps(run, 3)
        with pytest.raises(RuntimeError) as raised:  # what verl's save raises, whole disk full
            torch.save({"w": torch.zeros(200_000)}, run / "global_step_3" / "actor" / "model.pt")
        assert "unexpected pos" in str(raised.value)  # torch's words for it: no ENOSPC
        # the console log could not take the error either (the same disk): told by free space
        status, lines = verdict(run, STAMP, 1, stopped=False)
        assert status == 1 and len(lines) == 1, lines
        assert lines[0].startswith(f"recipe: the disk holding {run} is full ("), lines
        assert "the save of step 3 failed" in lines[0], lines
        assert "global_step_2, which the tracker names; one takes 3" in lines[0], lines  # KiB
        del raised  # its writer holds the cut file open
        gc.collect()
        sh.rmtree(run / "global_step_3")  # space again: a failure that is not the disk's
        assert verdict(run, STAMP, 1, stopped=False) == (1, [])
    finally:
        subprocess.run(["umount", "-l", str(mount)])
        sh.rmtree(mount, ignore_errors=True)
