"""Nothing of a launch outlives it (launch/reap.py, launch/lock.py), on real processes: found by
environment or session, re-parented or deaf to SIGTERM, and ended, another launch's never; a
SIGTERM to one of verl's processes is a stop request (verl_plugins/stop_on_sigterm.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT

from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR
from verl_gsm8k.common.procs import alive, blocks_sigterm, session_of
from verl_gsm8k.common.run_dir import SESSION_FILE, lock_path, new_stamp
from verl_gsm8k.guard.stop import read_request, request
from verl_gsm8k.launch.lock import Busy, lock_run_dir
from verl_gsm8k.launch.reap import check_run_dir, main, of_launch, read_session, stop, stop_launch
from verl_gsm8k.launch.supervise import start

pytestmark = pytest.mark.timeout(300)
BLOCKED = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
           "os.execvp(sys.argv[1], sys.argv[1:])")  # fmt: skip


def orphan(launch: str, run_dir: Path, blocked: bool = False) -> int:
    """A `sleep` of ``launch`` re-parented to init, as Ray's daemons are; its pid, once exec'd."""
    env = dict(os.environ, **{ENV_LAUNCH: launch, ENV_RUN_DIR: str(run_dir)})
    sleeper = [sys.executable, "-c", BLOCKED, "sleep", "300"] if blocked else ["sleep", "300"]
    script = f"{' '.join(repr(a) for a in sleeper)} >/dev/null 2>&1 & echo $!"
    pid = int(subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                             text=True).stdout)  # fmt: skip
    end = time.monotonic() + 10
    while time.monotonic() < end and Path(f"/proc/{pid}/cmdline").read_bytes()[:5] != b"sleep":
        time.sleep(0.05)
    return pid


def killed(*pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_stop_ends_a_launch_only_also_deaf_to_sigterm(tmp_path: Path, capsys):
    mine = f"L1-{os.getpid()}"  # no other test's id, on any worker
    ours = [orphan(mine, tmp_path), orphan(mine, tmp_path, blocked=True)]
    other = orphan(f"L2-{os.getpid()}", tmp_path / "other")
    try:
        assert blocks_sigterm(ours[1]) and not blocks_sigterm(ours[0])
        started = time.monotonic()
        assert stop(of_launch(mine), {}, f"launch {mine}", settle_s=0.5, grace_s=30) == 0
        assert time.monotonic() - started < 10  # the one blocking SIGTERM killed at once
        said = capsys.readouterr().err
        assert not any(alive(pid) for pid in ours) and alive(other)
        stopped = f"recipe: 2 processes of launch {mine} outlived verl and were stopped (2x sleep)"
        assert stopped in said
        assert "1 of them by SIGKILL" in said, said
        assert stop_launch(mine, str(tmp_path)) == 0 and capsys.readouterr().err == ""
    finally:
        killed(*ours, other)


def test_check_waits_for_an_earlier_launch_and_stops_what_an_ended_launcher_left(
    tmp_path: Path, capsys
):
    """A launch id names its launcher (stamp, pid, host): an ended one's leftovers are stopped at
    once; a living one's, or another host's, waited for, then refused in one line."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stamp, host = new_stamp(), socket.gethostname()
    ended, living = f"{stamp}-{dead.pid}-{host}", f"{stamp}-{os.getpid()}-{host}"
    run_dir = tmp_path / "run's dir"
    left = [orphan(ended, run_dir, blocked=True), orphan(ended, run_dir)]
    try:
        started = time.monotonic()
        assert check_run_dir(str(run_dir), 30) == 0 and time.monotonic() - started < 10
        assert f"2 processes of launch {ended} outlived its launcher and were stopped" in (
            capsys.readouterr().err) and not any(alive(pid) for pid in left)  # fmt: skip
        for launch in (living, f"{stamp}-{dead.pid}-not-{host}"):
            pid = orphan(launch, run_dir, blocked=True)
            try:
                assert check_run_dir(str(run_dir), 0, but=launch) == 0  # the caller's own
                assert check_run_dir(str(tmp_path / "elsewhere"), 0) == 0
                assert check_run_dir(str(run_dir), 0.5) == 2 and alive(pid)
                still = "1 processes of an earlier launch into it still run"
                assert f"{still} (sleep; pids {pid}; launch {launch})" in capsys.readouterr().err
            finally:
                killed(pid)
        assert check_run_dir(str(run_dir), 5) == 0
    finally:
        killed(*left)


def test_a_process_whose_environment_is_gone_is_found_by_its_session(tmp_path: Path, capsys):
    """Ray's retitled workers may hide their environment: the driver's session (supervise.start,
    named in the run directory) finds them."""
    env = dict(os.environ, **{ENV_LAUNCH: "L3", ENV_RUN_DIR: str(tmp_path)}, PYTHONPATH=str(ROOT))
    driver = ["bash", "-c", "env -i sleep 301 >/dev/null 2>&1 &"]
    assert start(driver, env, tmp_path, "L3", ppo=True).wait(timeout=60) == 0
    sid = int((tmp_path / SESSION_FILE).read_text().split()[0])
    pid = 0
    for _ in range(200):  # the background `env -i sleep` has exec'd
        pid = next((int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p)) and
                    Path(f"/proc/{p}/cmdline").read_bytes() == b"sleep\x00301\x00"
                    and session_of(int(p)) == sid), 0)  # fmt: skip
        if pid:
            break
        time.sleep(0.05)
    try:
        assert blocks_sigterm(pid) and read_session(str(tmp_path), "L4") == {}
        assert stop(of_launch("L3"), {}, "launch L3", settle_s=0) == 0 and alive(pid)  # no env
        assert check_run_dir(str(tmp_path), 0) == 2  # a relaunch sees it
        assert main(["stop", "--run-dir", str(tmp_path)]) == 0 and not alive(pid)
        assert "1 processes of launches into" in capsys.readouterr().err
    finally:
        killed(pid)


def test_the_lock_refuses_a_busy_run_dir_and_one_with_an_earlier_launchs_processes(tmp_path):
    """The refusal names the holder and tells a live launcher (or another host's) from an ended
    one's inherited lock; a free lock beside an earlier launch's processes is refused too."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    lock_path(run_dir).touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR)"
         "; fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(lock_path(run_dir))], stdout=subprocess.PIPE, text=True)  # fmt: skip
    said: list[str] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        ended = "its launcher has ended, another process holds the lock: fuser -v"
        for host, state in ((socket.gethostname(), ended), ("elsewhere", "(still running)")):
            lock_path(run_dir).write_text(f"launch 20260101T000000Z, pid {gone.pid} on {host}\n")
            with pytest.raises(Busy) as refused:
                lock_run_dir(run_dir, "20260102T000000Z", 0, lambda line, **_: said.append(line))
            line = str(refused.value)
            assert f"is in use by launch 20260101T000000Z, pid {gone.pid} on {host}" in line
            assert state in line and said == [], (line, said)  # LOCK_WAIT_S=0: no wait said
    finally:
        holder.kill()
        holder.wait()
    pid = orphan("20260101T000000Z-1-elsewhere", run_dir, blocked=True)
    try:
        with pytest.raises(Busy) as refused:
            lock_run_dir(run_dir, "20260102T000000Z", 0, print)
        assert str(refused.value) == ""  # said by the check, in one line
    finally:
        killed(pid)


WRAPPED = ("from ray._private.node import Node; "
           "print(hasattr(Node.kill_all_processes, 'gsm8k_at_once'))")  # fmt: skip


def test_a_sigterm_to_one_of_verls_processes_is_a_stop_request_from_outside_only(tmp_path):
    """From outside the launch: a stop request STOP_GRACE_S from now, never over one there; from
    inside (Ray's teardown) none; Ray's shutdown is SIGKILL. Without the mask: left as it is."""
    code = (
        "import os, signal, subprocess, sys, time, verl_gsm8k.verl_plugins.stop_on_sigterm as m; "
        "assert m._started; "
        "sender = subprocess.Popen([sys.executable, '-c', f'import os, signal, time; "
        "os.kill({os.getpid()}, signal.SIGTERM); time.sleep(30)']); time.sleep(1); "
        f"print('inside', os.path.exists({str(tmp_path / 'stop_requested')!r}), flush=True); "
        "sender.kill(); sender.wait(); os.kill(os.getpid(), signal.SIGTERM); time.sleep(1); "
        f"print('alive'); {WRAPPED}"
    )  # the child carries the launch id: a sender inside the launch
    env = dict(os.environ, **{ENV_LAUNCH: f"S-{os.getpid()}", ENV_RUN_DIR: str(tmp_path)},
               STOP_GRACE_S="40", PYTHONPATH=str(ROOT))  # fmt: skip
    before = time.time()
    out = subprocess.run([sys.executable, "-c", BLOCKED, sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("inside False\n"), out.stdout + out.stderr
    assert out.stdout.endswith("alive\nTrue\n") and out.stdout.count("stop requested") == 1
    deadline, why = read_request(tmp_path)
    assert before + 39 <= deadline <= time.time() + 41 and why == "sigterm"
    assert not request(tmp_path, 5.0, "sigterm") and read_request(tmp_path)[0] == deadline
    probe = f"import verl_gsm8k.verl_plugins.stop_on_sigterm as m; print(m._started); {WRAPPED}"
    unblocked = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                               text=True, timeout=60)  # fmt: skip
    assert unblocked.stdout.split() == ["False", "False"]
