"""recipes/lifecycle.sh's wait_for_verl returns verl's own status after a SIGTERM, also when verl
ends right as the signal lands: bash's `wait` for a pid, cut short by the trapped signal and
called again once the child has ended, returned 255 for a 5 in 6 of 40 tries here (bash 5.2.15).
The launcher's subshell records its status (exit_recorded) and wait_for_verl reads it.

The launch is the launcher's own pattern (recipes/common.sh), with a stand-in for verl that exits
5 on SIGTERM at once: a trap that writes the stop request (the real request_stop), a subshell
that ignores the signal until its child ends, SIGTERM to the whole process group at once."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import ROOT

LAUNCH = """set -uo pipefail
source "{root}/recipes/lifecycle.sh"
RUN_DIR={run_dir} STOP_GRACE_S=30 STOP_GRACE_SET=1 PYTHON=python3
VERL_STATUS_FILE=$(mktemp)
trap 'request_stop' TERM
( trap ':' TERM
  bash -c 'trap "exit 5" TERM; echo up > {run_dir}/up; while :; do sleep 0.05; done'
  exit_recorded $? ) &
VERL_PID=$!
wait_for_verl
echo "status $?"
"""


def test_verls_status_survives_a_sigterm_that_ends_it_at_once(tmp_path: Path):
    script = tmp_path / "launch.sh"
    script.write_text(LAUNCH.format(root=ROOT, run_dir=tmp_path))
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(60):
        (tmp_path / "up").unlink(missing_ok=True)
        launch = subprocess.Popen(
            ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        end = time.monotonic() + 10
        while not (tmp_path / "up").exists() and time.monotonic() < end:
            time.sleep(0.01)
        os.killpg(launch.pid, signal.SIGTERM)  # every process of the launch at once
        try:
            out, _ = launch.communicate(timeout=10)
            seen[out.strip().splitlines()[-1]] += 1
        except subprocess.TimeoutExpired:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.communicate()
            seen["no return"] += 1
    assert seen == {"status 5": 60}, seen
