"""Nothing of a launch outlives it (verl_gsm8k/launch/reap.py), on real processes: the ones a
launch started are found by their environment, also re-parented and with SIGTERM blocked, and
ended; another launch's are never touched; a launch refuses to train beside an earlier one's.
(The whole path, a real launch under SIGTERM to all its processes, is the requeue of
tests/test_slurm_nodes_cpu.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, run_recipe

from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR
from verl_gsm8k.common.procs import blocks_sigterm
from verl_gsm8k.common.run_dir import SESSION_FILE, lock_path
from verl_gsm8k.launch.lock import Busy, lock_run_dir
from verl_gsm8k.launch.reap import main
from verl_gsm8k.launch.supervise import start
from verl_gsm8k.verl_plugins.stop_on_sigterm import request_stop

BLOCKED = (
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)

WRAPPED = (
    "from ray._private.node import Node as N; print(hasattr(N.kill_all_processes, 'gsm8k_at_once'))"
)


def orphan(launch: str, run_dir: Path, blocked: bool = False) -> int:
    """A process of ``launch`` re-parented to init (its parent exited), as Ray's daemons are
    once verl's driver is gone; its pid."""
    env = dict(os.environ, **{ENV_LAUNCH: launch, ENV_RUN_DIR: str(run_dir)})
    sleeper = [sys.executable, "-c", BLOCKED, "sleep", "300"] if blocked else ["sleep", "300"]
    script = f"{' '.join(repr(a) for a in sleeper)} >/dev/null 2>&1 & echo $!"
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    pid = int(out.stdout.strip())
    end = time.monotonic() + 10
    while time.monotonic() < end and not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(
        b"sleep"
    ):
        time.sleep(0.05)  # the exec has happened: its mask and environment are final
    return pid


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def in_session(pid: int, sid: int) -> bool:
    try:
        return os.getsid(pid) == sid
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_stop_ends_a_launch_only_also_deaf_to_sigterm(tmp_path: Path, capsys):
    ours = [orphan("L1", tmp_path), orphan("L1", tmp_path, blocked=True)]
    other = orphan("L2", tmp_path / "other")
    try:
        assert blocks_sigterm(ours[1]) and not blocks_sigterm(ours[0])
        started = time.monotonic()
        assert main(["stop", "--launch", "L1", "--settle", "0.5", "--grace", "30"]) == 0
        took = time.monotonic() - started
        said = capsys.readouterr().err
        assert not any(alive(pid) for pid in ours) and alive(other)
        assert "recipe: 2 processes of launch L1 outlived verl and were stopped (2x sleep)" in said
        assert "1 of them by SIGKILL" in said, said  # the one blocking SIGTERM, at once...
        assert took < 10, took  # ...not after the 30 s grace
        assert main(["stop", "--launch", "L1", "--settle", "0"]) == 0
        assert capsys.readouterr().err == ""  # nothing left: nothing said
    finally:
        for pid in [*ours, other]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_check_refuses_beside_an_earlier_launch_until_it_ends(tmp_path: Path, capsys):
    run_dir = tmp_path / "run's dir"
    pid = orphan("OLD", run_dir, blocked=True)
    try:
        assert main(["check", "--run-dir", str(run_dir), "--but", "OLD"]) == 0  # its own
        assert main(["check", "--run-dir", str(tmp_path / "elsewhere")]) == 0
        assert main(["check", "--run-dir", str(run_dir), "--wait", "0.5"]) == 2
        said = capsys.readouterr().err
        still = "1 processes of an earlier launch into it still run"
        assert f"{still} (sleep; pids {pid}; launch OLD)" in said, said
        os.kill(pid, signal.SIGKILL)
        assert main(["check", "--run-dir", str(run_dir), "--wait", "5"]) == 0
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_check_stops_what_a_launch_whose_launcher_has_ended_left(tmp_path: Path, capsys):
    """A launch id names its launcher (stamp, pid, host): when that pid has ended here, what the
    launch left is stopped at once (SIGTERM blocked: SIGKILL) and the check passes; a launch whose
    launcher lives, or ran on another host, is waited for and refused as before."""
    import socket

    from verl_gsm8k.common.run_dir import new_stamp

    dead = subprocess.Popen(["true"])
    dead.wait()
    stamp, host = new_stamp(), socket.gethostname()
    ended, living = f"{stamp}-{dead.pid}-{host}", f"{stamp}-{os.getpid()}-{host}"
    run_dir = tmp_path / "run"
    left = [orphan(ended, run_dir, blocked=True), orphan(ended, run_dir)]
    try:
        started = time.monotonic()
        assert main(["check", "--run-dir", str(run_dir), "--wait", "30"]) == 0
        assert time.monotonic() - started < 10  # not the 30 s wait
        said = capsys.readouterr().err
        assert f"2 processes of launch {ended} outlived its launcher and were stopped" in said
        assert not any(alive(pid) for pid in left)
        for launch in (living, f"{stamp}-{dead.pid}-not-{host}"):
            pid = orphan(launch, run_dir)
            try:
                assert main(["check", "--run-dir", str(run_dir), "--wait", "0.5"]) == 2
                assert f"launch {launch})" in capsys.readouterr().err and alive(pid)
            finally:
                os.kill(pid, signal.SIGKILL)
    finally:
        for pid in left:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_held_lock_says_whether_its_launcher_still_runs(tmp_path: Path):
    """The refusal's line names the lock's holder and tells a live launcher (or one on another
    host, never judged from here) from a lock held on after its launcher ended (fuser names the
    holder: a process that inherited it)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    lock_path(run_dir).touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR)"
         "; fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(lock_path(run_dir))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for host, state in [
            (socket.gethostname(), "its launcher has ended, another process holds the lock"),
            ("elsewhere", "(still running)"),
        ]:
            lock_path(run_dir).write_text(f"launch 20260101T000000Z, pid {gone.pid} on {host}\n")
            if host != "elsewhere":
                assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(Busy) as refused:
                lock_run_dir(run_dir, "20260102T000000Z", 0, print)
            line = str(refused.value)
            assert f"is in use by launch 20260101T000000Z, pid {gone.pid} on {host}" in line, line
            assert state in line, line
            assert "fuser" in line if host != "elsewhere" else "fuser" not in line, line
    finally:
        holder.kill()
        holder.wait()


def test_a_launch_refuses_to_train_beside_survivors_of_an_earlier_one(tmp_path: Path):
    """The launcher's run-directory lock: free (the survivors hold no lock), and still refused,
    in one line, before verl starts."""
    from test_train_cpu import cpu_env

    env = cpu_env(tmp_path / "home", tmp_path / "runs", SKIP_PREFLIGHT="1")
    run_dir = tmp_path / "runs" / "smoke_tiny"
    pid = orphan("20260101T000000Z-1-elsewhere", run_dir, blocked=True)
    try:
        result = run_recipe("smoke_tiny", env, timeout=180)
        said = result.stdout + result.stderr
        assert result.returncode == 2, said[-3000:]
        still = "is in use: 1 processes of an earlier launch into it still run"
        assert f"{still} (sleep; pids {pid}" in said, said[-3000:]
        assert "Started a local Ray instance" not in said and "launch: recorded" not in said
    finally:
        os.kill(pid, signal.SIGKILL)


def test_sigterm_to_one_process_is_a_stop_request_never_over_the_launchers(tmp_path: Path):
    """verl_plugins/stop_on_sigterm.py in a process started as the launcher starts verl's."""
    code = (
        "import os, signal, time, verl_gsm8k.verl_plugins.stop_on_sigterm as m; "
        "assert m._started; os.kill(os.getpid(), signal.SIGTERM); time.sleep(1); print('alive'); "
        f"{WRAPPED}"
    )  # Ray's shutdown of its processes, which block SIGTERM: SIGKILL at once
    env = dict(os.environ, **{ENV_RUN_DIR: str(tmp_path)}, STOP_GRACE_S="40",
               PYTHONPATH=str(ROOT))  # fmt: skip
    command = [sys.executable, "-c", BLOCKED, sys.executable, "-c", code]
    before = time.time()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.endswith("alive\nTrue\n"), out.stdout + out.stderr
    assert "stop requested; the trainer saves the step in flight" in out.stdout
    assert before + 39 <= float((tmp_path / "stop_requested").read_text()) <= time.time() + 41
    assert not request_stop(tmp_path, 5.0)  # a request already there is kept
    assert float((tmp_path / "stop_requested").read_text()) >= before + 39
    probe = f"import verl_gsm8k.verl_plugins.stop_on_sigterm as m; print(m._started); {WRAPPED}"
    unblocked = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                               text=True, timeout=60)  # fmt: skip
    assert unblocked.stdout.split() == ["False", "False"]  # no mask: the process is left as it is


def test_sigterm_from_inside_the_launch_is_rays_teardown_not_a_stop(tmp_path: Path):
    """At a run's end Ray's raylet (a process of the launch) sends SIGTERM to its actors: no stop
    request, no line (it left a stale RUN_DIR/stop_requested after every run); the same signal
    from outside the launch, as Slurm's, still is one."""
    code = (
        "import os, signal, subprocess, sys, time, verl_gsm8k.verl_plugins.stop_on_sigterm as m; "
        "assert m._started; "
        "sender = subprocess.Popen([sys.executable, '-c', f'import os, signal, time; "
        "os.kill({os.getpid()}, signal.SIGTERM); time.sleep(30)']); time.sleep(1); "
        f"print('inside', os.path.exists({str(tmp_path / 'stop_requested')!r}), flush=True); "
        "sender.kill(); sender.wait(); os.kill(os.getpid(), signal.SIGTERM); time.sleep(1)"
    )  # the child inherits the launch id: a sender inside the launch, alive while it is judged
    # (a sender gone before the judging thread reads its environment counts as outside)
    env = dict(os.environ, **{ENV_LAUNCH: "L1", ENV_RUN_DIR: str(tmp_path)}, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-c", BLOCKED, sys.executable, "-c", code]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("inside False\n"), out.stdout + out.stderr
    assert out.stdout.count("stop requested") == 1 and (tmp_path / "stop_requested").is_file()


pytestmark = pytest.mark.timeout(300)


def test_a_process_whose_environment_is_gone_is_found_by_its_session(tmp_path: Path, capsys):
    """Ray retitles its workers (setproctitle), which may overwrite what /proc shows of their
    environment: the launcher starts verl's driver in a session of its own (supervise.start),
    named in the run directory, and a process of that session is stopped all the same."""
    env = dict(os.environ, **{ENV_LAUNCH: "L3", ENV_RUN_DIR: str(tmp_path)}, PYTHONPATH=str(ROOT))
    driver = ["bash", "-c", "env -i sleep 301 >/dev/null 2>&1 &"]
    assert start(driver, env, tmp_path, "L3", ppo=True).wait(timeout=60) == 0
    sid = int((tmp_path / SESSION_FILE).read_text().split()[0])
    pid = 0
    for _ in range(200):  # the background `env -i sleep` has exec'd
        pid = next((int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                    and cmdline(int(p)) == b"sleep\x00301\x00" and in_session(int(p), sid)),
                   0)  # fmt: skip
        if pid:
            break
        time.sleep(0.05)
    try:
        assert os.getsid(pid) == sid and blocks_sigterm(pid)
        assert main(["stop", "--launch", "L3", "--settle", "0"]) == 0 and alive(pid)  # no env
        assert capsys.readouterr().err == ""
        assert main(["check", "--run-dir", str(tmp_path)]) == 2  # a relaunch sees it
        capsys.readouterr()
        assert main(["stop", "--launch", "L3", "--session-of", str(tmp_path), "--settle", "0"]) == 0
        assert not alive(pid)
        assert "1 processes of launch L3 outlived verl" in capsys.readouterr().err
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
