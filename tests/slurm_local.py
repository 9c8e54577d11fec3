"""A real Slurm for the tests: munged, slurmctld and one slurmd per node started from a slurm.conf
in a temporary folder (docs/slurm.md, "What was measured"). Nothing is installed here: CI installs
Debian's ``slurm-wlm`` and ``munge`` (.ci/run); without them the caller skips through
``helpers.require_path`` (a failure under CI=true).

One node is this machine under its own name, with its own CPUs. Several nodes are node names on
this one machine (n1, n2, ...), each its own ``slurmd -N NAME`` on its own port, claiming the
``cpus`` it is given (``SlurmdParameters=config_overrides``: Slurm trusts the file, not the
hardware): a job's steps then run on "each node" here, as on a cluster whose nodes all mount
the same storage.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers import require_path

from verl_gsm8k.common import procs

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "squeue", "scancel", "sinfo")


def missing_binary() -> str | None:
    """The first daemon or client not on PATH (nor in /usr/sbin), or None."""
    for name in DAEMONS + CLIENTS:
        if binary(name) is None:
            return name
    return None


def require_slurm() -> None:
    """Skip the test without Slurm's daemons and clients (a failure under CI=true)."""
    missing = missing_binary()
    require_path(
        Path(binary(missing) or f"/usr/bin/{missing}") if missing else Path("/"),
        f"no {missing} (Debian's slurm-wlm and munge: apt-get install slurm-wlm munge)",
    )


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
    nodes: tuple[str, ...]
    cpus: int  # each node's
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

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
        return fields_of(self.run("scontrol", "show", "job", "-o", job_id).stdout)

    def wait_for(self, what: str, ready: Callable[[], bool], job: str, out: Path,
                 timeout: float) -> float:  # fmt: skip
        """Poll ``ready`` every half second; the seconds it took. Past ``timeout``: the job
        cancelled, and a failure naming what never came, the job's fields (or scontrol's error),
        the daemons no longer running, the job's output's end and slurmctld's log's."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if ready():
                return time.monotonic() - start
            time.sleep(0.5)
        shown = self.run("scontrol", "show", "job", "-o", job)
        self.run("scancel", job)
        text = out.read_text(errors="replace") if out.exists() else ""
        fields = fields_of(shown.stdout) or shown.stderr.strip()  # at the timeout, not cancelled
        raise AssertionError(
            f"no {what} after {timeout} s: {fields}; daemons "
            f"gone: {self.gone() or 'none'}\n{text[-6000:]}\nslurmctld.log:\n"
            + self.log("slurmctld")[-2000:]
        )  # fmt: skip

    def gone(self) -> list[str]:
        """The daemons of this cluster no longer running (a zombie counts as ended)."""
        return [name for name, pid in self.pids.items() if not procs.alive(pid)]

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def fields_of(shown: str) -> dict[str, str]:
    """``scontrol show job -o``'s words as fields (the first of each key)."""
    fields: dict[str, str] = {}
    for word in shown.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def seconds(runtime: str) -> int:
    """scontrol's RunTime or TimeLimit, [D-]HH:MM:SS, in seconds."""
    days, _, clock = runtime.rpartition("-")
    hours, minutes, secs = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + secs


def write_conf(folder: Path, nodes: tuple[str, ...], cpus: int, socket_path: Path) -> Path:
    conf = folder / "slurm.conf"
    host = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=verlgsm8k",
        f"SlurmctldHost={host}(127.0.0.1)",
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
        f"SlurmdSpoolDir={folder / 'spool' / '%n'}",  # %n: the node's name
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
        "SlurmdParameters=config_overrides",  # the CPUs and memory below, whatever is here
    ]
    for node in nodes:  # several names on one machine: each slurmd on its own port
        where = f"NodeHostname={host} Port={free_port()} " if len(nodes) > 1 else ""
        lines.append(f"NodeName={node} {where}NodeAddr=127.0.0.1 CPUs={cpus} "
                     f"RealMemory={memory_mib()} State=UNKNOWN")  # fmt: skip
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
                 "State=UP")  # fmt: skip
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
def slurm_cluster(
    folder: Path, nodes: int = 1, cpus: int = 0, start_timeout: float = 60
) -> Iterator[Cluster]:
    """Start munged, slurmctld and a slurmd per node in ``folder`` (one node: this machine's
    name and CPU count; several: n1, n2, ..., ``cpus`` each); wait until every node is idle; stop
    them all (by the pids they wrote) when the block ends."""
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o700)
    if nodes == 1:
        names: tuple[str, ...] = (socket.gethostname().split(".")[0],)
    else:
        names = tuple(f"n{i}" for i in range(1, nodes + 1))
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = folder / "munge" / "munge.socket"
    cpus = cpus or os.cpu_count() or 1
    conf = write_conf(folder, names, cpus, sock)
    cluster = Cluster(folder, conf, names, cpus)
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        subprocess.run(
            [binary("munged") or "munged", "--force", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={folder / 'munge' / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
             f"--seed-file={folder / 'munge' / 'munged.seed'}"],
            check=True, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        cluster.pids["munged"] = _pid(folder / "munge" / "munged.pid", 10)
        subprocess.run([binary("slurmctld") or "slurmctld", "-f", str(conf)], env=env,
                       check=True, capture_output=True, text=True, timeout=30)  # fmt: skip
        cluster.pids["slurmctld"] = _pid(folder / "slurmctld.pid", 20)
        for name in names:
            slurmd = [binary("slurmd") or "slurmd", "-f", str(conf), "-N", name]
            subprocess.run(slurmd, env=env, check=True, capture_output=True, text=True,
                           timeout=30)  # fmt: skip
            cluster.pids[f"slurmd {name}"] = _pid(folder / f"slurmd-{name}.pid", 20)
        end = time.monotonic() + start_timeout
        while True:
            shown = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
            states = dict(zip(shown[::2], shown[1::2], strict=False))
            if all(states.get(name, "").startswith("idle") for name in names):
                break
            if time.monotonic() > end:
                raise RuntimeError(
                    f"the Slurm nodes are {states or 'not listed'} after {start_timeout} s:\n"
                    + cluster.log("slurmctld")[-3000:]
                    + "".join(cluster.log(f"slurmd-{name}")[-3000:] for name in names)
                )  # fmt: skip
            time.sleep(0.5)
        yield cluster
    finally:
        if "slurmctld" in cluster.pids:  # no job outlives the cluster: cancel, wait for the end
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
            while time.monotonic() < end:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
