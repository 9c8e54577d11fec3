"""The launcher's supervision of verl (verl_gsm8k/launch/supervise.py), verl stood in for: verl's
own status survives a SIGTERM to every process at once; a SIGTERM to the launcher alone is a stop
request, and verl is stopped when the grace is over; verl dies with a SIGKILLed launcher."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from verl_gsm8k.common.procs import alive

LAUNCHER = """
import os, sys
from pathlib import Path
from verl_gsm8k.launch.supervise import Supervisor

run, ppo, grace, verl = Path(sys.argv[1]), sys.argv[2] == "ppo", int(sys.argv[3]), sys.argv[4]
supervisor = Supervisor(run, grace, {}, lambda line, err=False: print(line, flush=True))
code = supervisor.run(["bash", "-c", verl], dict(os.environ), run / "console.log", ppo,
                      f"L1-{os.getpid()}")  # its own id: reaps no other test's
print("status", code, "stop requested" if supervisor.deadline else "", flush=True)
"""


def launch(run: Path, ppo: bool, grace: int, verl: str) -> subprocess.Popen:
    """The launcher in a process of its own, running ``verl``, once that says it is up (its
    line written whole, then renamed: never read half written)."""
    up = run / "up"
    up.unlink(missing_ok=True)
    verl = f"echo $$ > {run}/up.tmp && mv {run}/up.tmp {up}; {verl}"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run), "ppo" if ppo else "sft",
                             str(grace), verl], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    end = time.monotonic() + 60
    while not up.exists() and time.monotonic() < end:
        time.sleep(0.01)
    assert up.exists()
    return proc


def test_verls_status_survives_a_sigterm_to_every_process_at_once(tmp_path: Path):
    """SFT's torchrun stood in for, SIGTERM blocked: it sees the stop request and exits 5,
    and the launch's status is 5 every time (unblocked, the stand-in would die of it: 143)."""
    stop = tmp_path / "stop_requested"
    verl = f"while [[ ! -e {stop} ]]; do sleep 0.05; done; exit 5"
    seen = []
    for _ in range(10):
        stop.unlink(missing_ok=True)
        proc = launch(tmp_path, False, 30, verl)
        os.killpg(proc.pid, signal.SIGTERM)  # every process of the launch at once
        seen.append(proc.communicate(timeout=60)[0].strip().splitlines()[-1])
    assert seen == ["status 5 stop requested"] * 10, seen
    assert stop.read_text().split()[1] == "sigterm"


def test_a_sigterm_to_the_launcher_is_a_stop_request_and_the_grace_ends_verl(tmp_path: Path):
    """PPO: verl's driver blocks SIGTERM in a session of its own; the launcher writes the stop
    request, and once the grace is over stops verl (SIGKILL, since it blocks SIGTERM): 143."""
    proc = launch(tmp_path, True, 1, "while :; do sleep 0.05; done")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "recipe: SIGTERM: the trainer saves the step in flight and stops (within " in out
    assert "STOP_GRACE_S=1 s" in out and "recipe: STOP_GRACE_S=1 s are over: stopping verl" in out
    assert out.strip().splitlines()[-1] == "status 143 stop requested", out
    session = (tmp_path / ".launch.session").read_text().split()
    assert session[1] == f"L1-{proc.pid}" and int(session[0]) != proc.pid


def test_the_trainers_stop_has_its_deadline_kept_unless_the_launcher_is_signalled(
    tmp_path: Path,
):
    """The trainer's request before a job's end: the launcher ends verl at its deadline (143);
    a SIGTERM to the launcher then sets the deadline by its own grace (verl ends itself)."""
    request = f"echo $(( $(date +%s) + 3 )) job-end > {tmp_path}/stop_requested"
    proc = launch(tmp_path, True, 600, f"{request}; while :; do sleep 0.05; done")
    out, _ = proc.communicate(timeout=60)
    assert out.strip().splitlines()[-1] == "status 143 stop requested", out
    proc = launch(tmp_path, True, 600, f"{request}; sleep 6; exit 5")
    time.sleep(1.5)  # the launcher has read the request
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert out.strip().splitlines()[-1] == "status 5 stop requested", out


def test_a_sigkill_of_the_launcher_ends_verl(tmp_path: Path):
    """No handler runs on SIGKILL: verl's driver (PPO, its own session) and torchrun (SFT) get
    the parent-death signal, and end with the launcher instead of training on without it."""
    for ppo in (True, False):
        proc = launch(tmp_path, ppo, 30, "while :; do sleep 0.05; done")
        stand_in = int((tmp_path / "up").read_text())
        proc.kill()
        proc.wait(timeout=30)
        end = time.monotonic() + 10
        while time.monotonic() < end and alive(stand_in):
            time.sleep(0.05)
        ended = not alive(stand_in)
        if not ended:
            os.kill(stand_in, signal.SIGKILL)
        assert ended, f"verl ({'ppo' if ppo else 'sft'}) lives on without its launcher"
