"""A real one-node Slurm for the tests: munged, slurmctld and slurmd started from a slurm.conf in a
temporary folder (docs/slurm.md, "What was measured"). Nothing is installed here: CI installs
Debian's ``slurm-wlm`` and ``munge`` (.ci/run); without them the caller skips through
``helpers.require_path`` (a failure under CI=true).

Everything lives in the folder: the munge key and socket, Slurm's state, spool, pid and log files,
on ports picked free. The clients find it through ``SLURM_CONF`` (``Cluster.env``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "squeue", "scancel", "sinfo")


def missing_binary() -> str | None:
    """The first daemon or client not on PATH (nor in /usr/sbin), or None."""
    for name in DAEMONS + CLIENTS:
        if binary(name) is None:
            return name
    return None


def binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 * 9 // 10  # what slurmd sees, less a margin
    return 1024


@dataclass
class Cluster:
    folder: Path
    conf: Path
    node: str
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    @property
    def cpus(self) -> int:
        return os.cpu_count() or 1

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (its output as text, never raising)."""
        env = dict(env if env is not None else os.environ, **self.env)
        return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, RestartCnt, ExitCode, ...); {} once gone."""
        shown = self.run("scontrol", "show", "job", "-o", job_id)
        fields: dict[str, str] = {}
        for word in shown.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def write_conf(folder: Path, node: str, socket_path: Path) -> Path:
    conf = folder / "slurm.conf"
    lines = [
        "ClusterName=verlgsm8k",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # a requeued job waits cred_expire before it starts again (120 s by default)
        f"AuthInfo=socket={socket_path},cred_expire=10",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "JobRequeue=1",
        # SIGTERM to SIGKILL at a requeue or scancel (Slurm's default: 30 s): a CPU step and its
        # save under the suite's load, as a cluster's KillWait (or preemption GraceTime) must
        # cover a GPU step and its save (docs/slurm.md)
        "KillWait=120",
        "MinJobAge=600",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} "
        f"RealMemory={memory_mib()} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _pid(path: Path, timeout: float) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        time.sleep(0.1)
    raise RuntimeError(f"no pid file {path} after {timeout} s")


@contextlib.contextmanager
def slurm_cluster(folder: Path, start_timeout: float = 60) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd in ``folder``; wait until the node is idle; stop all
    three (by the pids they wrote) when the block ends."""
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o700)
    node = socket.gethostname().split(".")[0]
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = folder / "munge" / "munge.socket"
    conf = write_conf(folder, node, sock)
    cluster = Cluster(folder, conf, node)
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        subprocess.run(
            [binary("munged") or "munged", "--force", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={folder / 'munge' / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
             f"--seed-file={folder / 'munge' / 'munged.seed'}"],
            check=True, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        cluster.pids["munged"] = _pid(folder / "munge" / "munged.pid", 10)
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([binary(daemon) or daemon, "-f", str(conf)], env=env, check=True,
                           capture_output=True, text=True, timeout=30)  # fmt: skip
            cluster.pids[daemon] = _pid(folder / f"{daemon}.pid", 20)
        end = time.monotonic() + start_timeout
        while True:
            state = cluster.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()
            if state.startswith("idle"):
                break
            if time.monotonic() > end:
                raise RuntimeError(
                    f"the Slurm node is {state or 'not listed'} after {start_timeout} s:\n"
                    + cluster.log("slurmctld")[-3000:] + cluster.log("slurmd")[-3000:]
                )  # fmt: skip
            time.sleep(0.5)
        yield cluster
    finally:
        if "slurmctld" in cluster.pids:  # no job outlives the cluster: cancel, wait for the end
            cluster.run("scancel", "--user", str(os.getuid()))
            end = time.monotonic() + 60
            while time.monotonic() < end and cluster.run("squeue", "-h").stdout.strip():
                time.sleep(1)
        for daemon in reversed(DAEMONS):
            pid = cluster.pids.get(daemon)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for daemon in reversed(DAEMONS):
            pid = cluster.pids.get(daemon)
            end = time.monotonic() + 20
            while pid is not None and time.monotonic() < end:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
