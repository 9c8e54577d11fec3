"""The test hook that holds a process at a named point (verl_gsm8k/common/pause.py): a point not
named never holds; a named one holds until its file is deleted, then never again; several points
named hold one after the other through the same file (tests/test_slurm_nodes_cpu.py holds one
launch before step 1 and the next before step 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PROGRAM = """
from verl_gsm8k.common.pause import pause_point
for name in ("rollout:1", "rollout:2", "rollout:3", "rollout:2"):
    pause_point(name)
    print(name, flush=True)
"""


def wait_held(held: Path, proc: subprocess.Popen[str], timeout: float = 30) -> str:
    end = time.monotonic() + timeout
    while not held.exists():
        assert proc.poll() is None, f"ended without holding: {proc.communicate()}"
        assert time.monotonic() < end, f"not held after {timeout} s"
        time.sleep(0.05)
    return held.read_text().strip()


def test_each_point_named_holds_once_until_its_file_is_deleted(tmp_path: Path):
    held = tmp_path / "held"
    env = dict(os.environ, GSM8K_PAUSE_AT="rollout:2,rollout:3", GSM8K_PAUSE_FILE=str(held))
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "rollout:1"  # not named: no hold
    for point in ("rollout:2", "rollout:3"):
        assert wait_held(held, proc) == str(proc.pid)
        time.sleep(0.3)
        assert proc.poll() is None, f"{point}: went on while held"
        held.unlink()
        assert proc.stdout.readline().strip() == point
    # rollout:2 again: released once, it holds no more. Read through the same buffer as
    # readline (communicate() reads the pipe itself and would miss a line readline buffered)
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    out = proc.stdout.read()
    assert out.strip() == "rollout:2" and not held.exists(), out
