"""A real Slurm for the tests: munged, slurmctld and one slurmd per node name (n1, n2, ... on this
one machine, each on its own port), from a slurm.conf in a temporary folder (SLURM_CONF).
Without Debian's slurm-wlm and munge the test skips (a failure under CI=true)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers import require_path

from verl_gsm8k.common import procs


def binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def require_slurm() -> None:
    tools = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo")
    missing = next((name for name in tools if binary(name) is None), None)
    require_path(Path(f"/usr/bin/{missing}") if missing else Path("/"),
                 f"no {missing} (Debian's slurm-wlm and munge)")  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fields_of(shown: str) -> dict[str, str]:
    """``scontrol show job -o``'s words as fields (the first of each key)."""
    fields: dict[str, str] = {}
    for key, sep, value in (word.partition("=") for word in shown.split()):
        if sep:
            fields.setdefault(key, value)
    return fields


def seconds(runtime: str) -> int:
    """scontrol's RunTime or TimeLimit, [D-]HH:MM:SS, in seconds."""
    days, _, clock = runtime.rpartition("-")
    hours, minutes, secs = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + secs


@dataclass
class Cluster:
    folder: Path
    conf: Path
    cpus: int  # each node's
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:  # fmt: skip
        """A client command against this cluster (its output as text, never raising)."""
        env = dict(env if env is not None else os.environ, **self.env)
        return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, RunTime, ...); {} once gone."""
        return fields_of(self.run("scontrol", "show", "job", "-o", job_id).stdout)

    def wait_for(self, what: str, ready: Callable[[], bool], job: str, out: Path,
                 timeout: float) -> float:  # fmt: skip
        """Poll ``ready``; the seconds it took. Past ``timeout``: the job cancelled, and a
        failure naming what never came, the job's fields (or scontrol's error), the daemons no
        longer running, the end of the job's output and of slurmctld's log."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if ready():
                return time.monotonic() - start
            time.sleep(0.5)
        shown = self.run("scontrol", "show", "job", "-o", job)
        self.run("scancel", job)
        text = out.read_text(errors="replace") if out.exists() else ""
        gone = [name for name, pid in self.pids.items() if not procs.alive(pid)]
        raise AssertionError(
            f"no {what} after {timeout} s: {fields_of(shown.stdout) or shown.stderr.strip()}; "
            f"daemons gone: {gone or 'none'}\n{text[-6000:]}\nslurmctld.log:\n"
            + self.log("slurmctld")[-2000:])  # fmt: skip

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def write_conf(folder: Path, nodes: tuple[str, ...], cpus: int, socket_path: Path) -> Path:
    host = socket.gethostname().split(".")[0]
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal:")) // 1024 * 9 // 10  # fmt: skip
    lines = [
        "ClusterName=verlgsm8k", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root",
        "SlurmdUser=root", f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # a requeued job waits cred_expire before it starts again (120 s by default)
        f"AuthInfo=socket={socket_path},cred_expire=10",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "MpiDefault=none", "SwitchType=switch/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill", "ReturnToService=2", "JobRequeue=1",
        # a released job starts once its BeginTime passed, not up to a minute later
        "SchedulerParameters=sched_interval=1",
        # SIGTERM to SIGKILL (default 30 s): long enough for a CPU step and its save under load
        "KillWait=120", "MinJobAge=600", f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool' / '%n'}", f"SlurmctldPidFile={folder / 'ctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd-%n.pid'}", f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd-%n.log'}", "SlurmdParameters=config_overrides",
    ]  # fmt: skip
    for node in nodes:  # several names on one machine: each slurmd on its own port
        lines.append(f"NodeName={node} NodeHostname={host} Port={free_port()} "
                     f"NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} State=UNKNOWN")  # fmt: skip
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
                 "State=UP")  # fmt: skip
    conf = folder / "slurm.conf"
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
def slurm_cluster(folder: Path, nodes: int, cpus: int, start_timeout: float = 60
                  ) -> Iterator[Cluster]:  # fmt: skip
    """munged, slurmctld and a slurmd per node in ``folder``, every node idle; all stopped (by
    the pids they wrote) when the block ends, no job left."""
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o700)
    names = tuple(f"n{i}" for i in range(1, nodes + 1))
    key, sock = folder / "munge" / "munge.key", folder / "munge" / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    cluster = Cluster(folder, write_conf(folder, names, cpus, sock), cpus)
    conf = str(cluster.conf)

    def daemon(name: str, argv: list[str], pid_file: Path) -> None:
        subprocess.run([binary(argv[0]) or argv[0], *argv[1:]], env=dict(os.environ, **cluster.env),
                       check=True, capture_output=True, text=True, timeout=30)  # fmt: skip
        cluster.pids[name] = _pid(pid_file, 20)

    try:
        pid, log, seed = (folder / "munge" / name for name in ("pid", "log", "seed"))
        daemon("munged", ["munged", "--force", f"--key-file={key}", f"--socket={sock}",
                          f"--pid-file={pid}", f"--log-file={log}", f"--seed-file={seed}"],
               pid)  # fmt: skip
        daemon("slurmctld", ["slurmctld", "-f", conf], folder / "ctld.pid")
        for name in names:
            daemon(f"slurmd {name}", ["slurmd", "-f", conf, "-N", name],
                   folder / f"slurmd-{name}.pid")  # fmt: skip
        end = time.monotonic() + start_timeout
        while True:
            shown = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
            states = dict(zip(shown[::2], shown[1::2], strict=False))
            if all(states.get(name, "").startswith("idle") for name in names):
                break
            if time.monotonic() > end:
                log = cluster.log("slurmctld")[-3000:]
                raise RuntimeError(f"the Slurm nodes are {states} after {start_timeout} s:\n{log}")
            time.sleep(0.5)
        yield cluster
    finally:
        if "slurmctld" in cluster.pids:  # no job outlives the cluster
            cluster.run("scancel", "--user", str(os.getuid()))
            end = time.monotonic() + 60
            while time.monotonic() < end and cluster.run("squeue", "-h").stdout.strip():
                time.sleep(1)
        daemons = list(reversed(cluster.pids.values()))  # slurmds, slurmctld, munged
        for pid in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in daemons:
            end = time.monotonic() + 20
            while time.monotonic() < end and procs.alive(pid):
                time.sleep(0.2)
