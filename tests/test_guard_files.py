"""How a launch ended, from the guard's files (launch/outcome.py), and pruning (guard/prune.py)
never removing the tracked step or the best, also after a kill mid-prune."""

import gc
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pause_points
import pytest
import torch
from helpers import skip_or_fail

from verl_gsm8k.common.run_dir import EXIT_WATCHDOG, append_trip, console_log_path, write_best
from verl_gsm8k.guard.prune import prune
from verl_gsm8k.launch.outcome import failed_groups, verdict

STAMP, OTHER = "20261125T101500Z", "20261125T090000Z"


def steps(run_dir: Path, *numbers: int) -> None:
    for n in numbers:
        (run_dir / f"global_step_{n}" / "actor").mkdir(parents=True)


def trip(step: int, launch: str, action: str = "stop") -> dict:
    return {"launch": launch, "step": step, "rule": "non_finite", "metric": "critic/score/mean",
            "value": float("nan"), "threshold": "not finite", "action": action,
            "last_healthy_checkpoint": step - 1,
            "message": f"watchdog: non_finite at step {step}"}  # fmt: skip


def test_a_watchdog_stop_of_this_launch_is_exit_4_and_warnings_are_counted(tmp_path: Path):
    append_trip(tmp_path, trip(3, OTHER))  # an earlier launch's trip is not this one's
    assert verdict(tmp_path, STAMP, 0) == (0, [])
    append_trip(tmp_path, trip(4, STAMP, "warn"))
    append_trip(tmp_path, trip(5, STAMP, "warn"))
    status, (line,) = verdict(tmp_path, STAMP, 1)
    assert status == 1 and "warned 2 time(s), the run went on" in line  # verl's status kept
    assert "non_finite at step 4" in line and "WATCHDOG=warn" not in line  # warns under stop too
    append_trip(tmp_path, trip(9, STAMP))
    assert verdict(tmp_path, STAMP, 0) == (EXIT_WATCHDOG, [
        "recipe: watchdog: non_finite at step 9 (WATCHDOG=stop: step 9 was not saved; the run "
        "stopped)"])  # fmt: skip


def test_pruning_keeps_the_newest_the_tracked_and_the_best(tmp_path: Path):
    steps(tmp_path, 2, 4, 6, 8, 10)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")  # after RESUME=disable
    write_best(tmp_path, 2, "val-core/openai/gsm8k/acc/mean@1", 0.57, STAMP)
    said = prune(tmp_path, 2)
    left = sorted(int(p.name.split("_")[-1]) for p in tmp_path.glob("global_step_*"))
    assert left == [2, 4, 8, 10] and not list(tmp_path.glob(".global_step_*")), said
    assert any("keeping" in line and "global_step_2: the best" in line for line in said)
    assert any("global_step_4: latest_checkpointed_iteration.txt names it" in line for line in said)
    assert prune(tmp_path, 2, say_kept=False) == []


def test_a_kill_mid_prune_leaves_nothing_a_later_prune_trips_on(tmp_path: Path):
    """SIGKILL between the rename of global_step_1 and its removal: the leftover is cleared, not
    renamed onto."""
    run, here = tmp_path / "run", tmp_path / "paused"
    steps(run, 1, 2, 3)
    (run / "global_step_1" / "actor" / "model.pt").write_bytes(b"weights")
    code = ("import sys, pause_points; from pathlib import Path; from verl_gsm8k.guard.prune "
            "import prune; prune(Path(sys.argv[1]), 2)")  # fmt: skip
    held = pause_points.env("prune:after_rename", here, dict(os.environ))
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], env=held)
    end = time.monotonic() + 60
    while not here.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert here.exists(), "prune never reached its pause point"
    proc.kill()
    proc.wait(timeout=30)
    leftover = run / ".global_step_1.removing"
    assert leftover.is_dir() and not (run / "global_step_1").exists()  # killed mid-removal
    steps(run, 1, 4)  # a resumed run saves step 1 again (RESUME=disable in the same directory)
    lines = prune(run, 2)
    assert sorted(p.name for p in run.iterdir()) == ["global_step_3", "global_step_4"], lines


def test_a_full_disk_mid_save_is_one_line(tmp_path: Path):
    """A real full disk (a 256 KiB tmpfs): the line names the disk, the failed step, the last whole
    checkpoint and its size."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode:
        skip_or_fail("mounting a tmpfs needs root (CI runs as root)")
    try:
        run = mount / "run"
        steps(run, 2, 3)
        torch.save({"w": torch.zeros(8_000)}, run / "global_step_2" / "actor" / "model.pt")
        (run / "latest_checkpointed_iteration.txt").write_text("2")
        with pytest.raises(RuntimeError) as raised:
            torch.save({"w": torch.zeros(200_000)}, run / "global_step_3" / "actor" / "model.pt")
        assert "unexpected pos" in str(raised.value)  # torch's words for it: no ENOSPC
        status, (line,) = verdict(run, STAMP, 1)
        assert status == 1 and line.startswith(f"recipe: the disk holding {run} is full (")
        assert "the save of step 3 failed" in line
        assert "global_step_2, which the tracker names; one takes 3" in line  # KiB
        del raised  # its writer holds the cut file open
        gc.collect()
        shutil.rmtree(run / "global_step_3")  # space again: a failure that is not the disk's
        assert verdict(run, STAMP, 1) == (1, [])
    finally:
        subprocess.run(["umount", "-l", str(mount)])
        shutil.rmtree(mount, ignore_errors=True)


def test_the_prompt_groups_verls_agent_loop_failed_are_counted_once_each(tmp_path: Path):
    """verl's V1 agent loop only logs a failed group (a line per failed response with its uid, or
    one without), pads it and trains on: the launch counts the groups."""
    log = console_log_path(tmp_path, STAMP)
    assert failed_groups(tmp_path, STAMP) is None  # no log
    log.parent.mkdir(parents=True)
    worker = "\x1b[36m(AgentLoopWorkerTQ pid=7)\x1b[0m ERROR:agent_loop_tq:"
    log.write_text("".join(f"{worker}Error in _run_prompt for uid={uid}\n" for uid in "aab")
                   + f"{worker}Error in _run_prompt: ValueError('suffix diff failed')\n"
                   + "step:1 - training/num_turns/mean:2.0\n")  # fmt: skip
    said = failed_groups(tmp_path, STAMP)
    assert said and said.startswith("recipe: verl's agent loop failed 3 prompt group(s)")
    assert str(log) in said
    log.write_text("step:1 - training/num_turns/mean:4.0\n")
    assert failed_groups(tmp_path, STAMP) is None
