"""What the sbatch files of slurm/ run inside a Slurm job (docs/slurm.md). Each finds the
repository, picks the interpreter, cd's to the repository's root and exec's this module, so the
job's batch process is this one:

    python -m verl_gsm8k.sbatch one-node RECIPE [key=value ...]
    python -m verl_gsm8k.sbatch multi-node RECIPE [key=value ...]

Bad input is one line starting ``slurm:``, and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

from verl_gsm8k.launch.reap import ENV_RAY_OF_JOB, stop_slurm_ray

# What tells the repository's root: the file the sbatch files run.
MARKER = "verl_gsm8k/sbatch/cli.py"
ONE_NODE = "slurm/one_node.sbatch"
MULTI_NODE = "slurm/multi_node.sbatch"
# The remote side of each `ray start`: SIGTERM blocked, then exec (slurmstepd made it a process
# group leader, which Ray's processes stay in); and what ends that group on a node (reap.py,
# "stop --slurm-ray").
REAP_EXEC = ("-m", "verl_gsm8k.launch.reap", "exec", "--")
REAP_STOP = ("-m", "verl_gsm8k.launch.reap", "stop", "--slurm-ray")
POLL_S = 5.0  # the join's polling period, and the head's head start before the workers
MODES = {
    "one-node": (ONE_NODE, "checks, then exec's the recipe: it becomes the job's batch process "
                 "and gets Slurm's signals itself"),
    "multi-node": (MULTI_NODE, "Ray on the job's nodes, the recipe as its driver on the first "
                   "node, SIGTERM passed on to it, Ray stopped on every node at the end"),
}  # fmt: skip

KNOBS = """environment variables (empty counts as unset, as in the recipes):
  LOCK_WAIT_S (120 here)       a requeued start waits that long for the previous start's
                               processes to end (the launcher's run-directory lock), then refuses
  SLURM_REQUEUE_ON_STOP (1)    a launch that stopped and saved before the run's end requeues
                               its job (the launcher's requeue)
  VERL_GSM8K_ROOT              the repository (default: SLURM_SUBMIT_DIR, else the current folder)
  PYTHON                       the sbatch files' interpreter for this module, and multi-node's
                               on every node (default: <root>/.venv/bin/python)
  SLURM_GPUS_ON_NODE           set by Slurm (--gpus-per-node, --gpus): one-node's
                               NDEVICES_PER_NODE, which may not ask for another number
multi-node only:
  GPUS_PER_NODE                GPUs per node (default: Slurm's SLURM_GPUS_ON_NODE)
  RAY_PORT (6379)              the Ray head's port
  RAY_JOIN_TIMEOUT_S (300)     how long to wait for every node's GPUs to join Ray
  RAY                          the ray command (default: the one beside this Python)
  SLURM_CPUS_ON_NODE           set by Slurm: each `ray start --num-cpus` (else Ray counts the
                               node's own CPUs, not the job's)
  RUN_DIR, RUNS_ROOT           the run directory's place: checked to be on storage every node
                               mounts (default: RUNS_ROOT=<root>/runs)
"""


def knob(name: str, default: str = "") -> str:
    """An environment variable read as bash reads ${NAME:-default}: empty counts as unset."""
    return os.environ.get(name) or default


def fail(line: str, status: int = 2) -> NoReturn:
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(status)


def say(line: str) -> None:
    print(line, flush=True)  # flushed: the job's output file holds other processes' lines too


def short_host() -> str:
    return socket.gethostname().split(".")[0]


def whole(name: str, default: str) -> int:
    """A knob that is a whole number; one line when it is not."""
    value = knob(name, default)
    if not re.fullmatch(r"[0-9]+", value):
        fail(f"slurm: {name}={value} is not a whole number")
    return int(value)


def require(file: str, tools: Sequence[str]) -> None:
    """Inside a Slurm job, with the client commands ``file`` needs; otherwise one line."""
    job = knob("SLURM_JOB_ID")
    if not job:
        if shutil.which("sbatch") is None:
            fail(
                f"slurm: no Slurm here (sbatch not found): {file} runs under Slurm "
                "(docs/slurm.md); without Slurm run the recipe itself: bash recipes/<recipe>.sh"
            )
        fail(
            f"slurm: {file} is a batch script: submit it, sbatch {file} recipes/<recipe>.sh "
            "[key=value ...] (docs/slurm.md)"
        )
    for tool in tools:
        if shutil.which(tool) is None:
            fail(
                f"slurm: {tool} not found on {short_host()} inside job {job}: {file} needs "
                "Slurm's client commands on the compute nodes"
            )


def repo_root(root: str) -> str:
    """``root`` when it is this repository (sbatch runs a copy of its file from a spool folder:
    the job finds the repository where it was submitted, or VERL_GSM8K_ROOT)."""
    if not Path(root, MARKER).is_file():
        fail(
            f"slurm: {root} is not this repository (no {MARKER}): submit from the "
            "repository's root, or set VERL_GSM8K_ROOT"
        )
    return root


def recipe_path(root: str, recipe: str) -> str:
    """The recipe to run: the first argument, a file of recipes/ (relative to the root)."""
    if not recipe or "=" in recipe:
        fail(
            "slurm: the first argument is the recipe to run (recipes/<name>.sh), its "
            f"key=value overrides after it; got '{recipe}'"
        )
    path = recipe if recipe.startswith("/") else f"{root}/{recipe}"
    if not Path(path).is_file():
        fail(f"slurm: no recipe {path} (the first argument: recipes/<name>.sh)")
    return path


def say_job(what: str) -> None:
    host = knob("SLURM_JOB_NODELIST") or short_host()
    say(
        f"slurm: job {knob('SLURM_JOB_ID')} ({knob('SLURM_JOB_NAME')}) restart "
        f"{knob('SLURM_RESTART_COUNT', '0')} on {host}: {what}"
    )


def command_line(root: str, recipe: str, overrides: Sequence[str]) -> str:
    return f"bash {recipe.removeprefix(root + '/')} {' '.join(overrides)}"


def export_defaults() -> None:
    """The launcher's knobs in a job: wait for the previous start's processes, requeue on a stop."""
    os.environ["LOCK_WAIT_S"] = knob("LOCK_WAIT_S", "120")
    os.environ["SLURM_REQUEUE_ON_STOP"] = knob("SLURM_REQUEUE_ON_STOP", "1")


def job_gpus() -> str:
    """The GPUs Slurm gave the job on this node (SLURM_GPUS_ON_NODE, from --gpus-per-node or
    --gpus) are the recipe's NDEVICES_PER_NODE; a NDEVICES_PER_NODE that asks for another number
    is one line, exit 2. What to add to the job's line ("" when Slurm gave no GPU count)."""
    gpus = knob("SLURM_GPUS_ON_NODE")
    if not re.fullmatch(r"[0-9]+", gpus) or int(gpus) < 1:
        return ""
    asked = knob("NDEVICES_PER_NODE")
    if asked and asked != gpus:
        fail(f"slurm: NDEVICES_PER_NODE={asked}, but Slurm gave this job {gpus} GPU(s) on its "
             f"node (SLURM_GPUS_ON_NODE): submit with --gpus-per-node={asked}, or leave "
             "NDEVICES_PER_NODE unset")  # fmt: skip
    os.environ["NDEVICES_PER_NODE"] = gpus
    return f", NDEVICES_PER_NODE={gpus} from SLURM_GPUS_ON_NODE"


def one_node(root: str, recipe: str, overrides: Sequence[str]) -> NoReturn:
    """The recipe replaces this process, so ``--signal=B:TERM@N`` reaches the launcher itself
    (save the step in flight, then stop). The run directory is the recipe's (from the environment
    captured at submission): the same across requeues, so each requeued start resumes it."""
    require(ONE_NODE, ("squeue", "scontrol"))
    root = repo_root(root)
    path = recipe_path(root, recipe)
    export_defaults()
    gpus = job_gpus()
    os.chdir(root)
    say_job(
        f"{command_line(root, path, overrides)} (LOCK_WAIT_S={os.environ['LOCK_WAIT_S']}, "
        f"requeue on a stop: {os.environ['SLURM_REQUEUE_ON_STOP']}{gpus})"
    )
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec: the
    # recipe gets the default, as it would from a shell
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    os.execvp("bash", ["bash", path, *overrides])


# ---- several nodes: Ray on Slurm ------------------------------------------------------------


def check_shared(base: str, nodes: int) -> None:
    """Every node of the job sees the run directory: a file written here must exist on each
    node (RUN_DIR if set, else RUNS_ROOT, where the recipe puts it). One line when one lacks it."""
    token = Path(base, f".slurm-shared-check-{knob('SLURM_JOB_ID')}")
    try:
        token.parent.mkdir(parents=True, exist_ok=True)
        token.write_bytes(b"")
    except OSError as err:
        fail(f"slurm: cannot write in {base}: {err.strerror}")
    probe = f'[[ -e {shlex.quote(str(token))} ]] && echo ok || echo "missing $(hostname -s)"'
    srun = ["srun", "--overlap", f"--nodes={nodes}", "--ntasks-per-node=1", "bash", "-c", probe]
    try:
        seen = subprocess.run(srun, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = seen.stdout.splitlines()
    except OSError:
        lines = []
    finally:
        token.unlink(missing_ok=True)
    missing = [line.removeprefix("missing ") for line in lines if line.startswith("missing ")]
    if missing or not any(line.startswith("ok") for line in lines):
        where = ",".join(f"not seen on {name}" for name in missing)
        fail(
            f"slurm: {base} is not on storage every node mounts ({where}): every node writes "
            "its ranks' checkpoint shards there; set RUNS_ROOT (or RUN_DIR) to a shared "
            "filesystem (docs/slurm.md)"
        )


def first_word(cmd: Sequence[str], what: str) -> str:
    """The first word ``cmd`` prints; one line when it fails or prints none."""
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        status, words = done.returncode, done.stdout.split()
    except OSError:
        status, words = 127, []
    if status != 0 or not words:
        fail(f"slurm: no {what} from `{shlex.join(cmd)}` (exit {status})")
    return words[0]


def ray_gpus(ray: str, address: str) -> int:
    """The GPUs Ray counts on the cluster at ``address`` (``ray status``), 0 when it does not
    answer."""
    try:
        cmd = [ray, "status", "--address", address]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    for line in out.splitlines():  # " 0.0/16.0 GPU": used/total
        found = re.match(r" *[0-9.]*/([0-9.]*) GPU", line)
        if found:
            total = found.group(1).split(".")[0]
            return int(total) if total else 0
    return 0


@dataclass
class Forwarder:
    """SIGTERM to this process: passed on to the recipe once it runs (it saves the step in flight
    and stops); before that, remembered (``stopping``): the recipe is then not started."""

    stopping: bool = False
    driver: subprocess.Popen[bytes] | None = None
    forwarded: bool = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self.driver is not None:
            self._forward()

    def _forward(self) -> None:
        self.forwarded = True
        if self.driver is not None and self.driver.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.driver.pid, signal.SIGTERM)

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, cut short by a SIGTERM."""
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))

    def run(self, argv: Sequence[str]) -> int:
        """Run ``argv`` as a child and wait for it: its exit status, 128+N for a signal N (as a
        shell reports it). waitpid is retried after the handler runs (PEP 475): the status is
        the child's, whatever signals come meanwhile."""
        self.driver = subprocess.Popen(argv)
        if self.stopping and not self.forwarded:  # the SIGTERM came while it was being started
            self._forward()
        status = self.driver.wait()
        return 128 - status if status < 0 else status


@dataclass
class RayNodes:
    """Ray on the job's nodes: one ``ray start --block`` srun step a node, each run with SIGTERM
    blocked (the reap module's exec), a mask its daemons and workers inherit: a SIGTERM to every
    process of the job (the time limit without ``B:``, a preemption, scancel) leaves the cluster
    up while the trainer saves the step in flight. ``stop`` ends them."""

    ray: str
    root: str
    head: str
    head_ip: str
    port: int
    nodes: int
    gpus: int
    steps: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    def _step(self, where: Sequence[str], *args: str) -> None:
        ray = [self.ray, "start", *args, "--block", f"--num-gpus={self.gpus}"]
        # Slurm's allocation (the batch node's: the nodes are alike with --exclusive); without
        # it Ray counts every CPU of the node, the job's or not
        cpus = knob("SLURM_CPUS_ON_NODE")
        if re.fullmatch(r"[1-9][0-9]*", cpus):
            ray.append(f"--num-cpus={cpus}")
        remote = [f"--chdir={self.root}", sys.executable, *REAP_EXEC, *ray]
        # srun passes its environment on: the mark that names the step's group as this job's Ray
        env = dict(os.environ, **{ENV_RAY_OF_JOB: knob("SLURM_JOB_ID")})
        self.steps.append(subprocess.Popen(["srun", "--overlap", *where, *remote], env=env))

    def start(self, stop: Forwarder) -> None:
        """The head on the first node (where this process, and so the driver, runs), then a
        worker on each other node; none after a SIGTERM."""
        ip, port = f"--node-ip-address={self.head_ip}", f"--port={self.port}"
        self._step(("--nodes=1", "--ntasks=1", "-w", self.head), "--head", ip, port)
        if self.nodes > 1:
            stop.pause(POLL_S)  # the head's head start
            if not stop.stopping:
                others = (f"--nodes={self.nodes - 1}", f"--ntasks={self.nodes - 1}")
                where = (*others, "--ntasks-per-node=1", "-x", self.head)
                self._step(where, f"--address={self.address}")

    def join(self, timeout: int, stop: Forwarder) -> tuple[int, int]:
        """Poll Ray until it counts every node's GPUs, ``timeout`` s at most, or a SIGTERM: the
        GPUs it counts and the seconds waited."""
        start = time.monotonic()
        while True:
            have = ray_gpus(self.ray, self.address)
            waited = int(time.monotonic() - start)
            if have >= self.nodes * self.gpus or waited >= timeout or stop.stopping:
                return have, waited
            stop.pause(POLL_S)

    def _wait(self, seconds: float) -> None:
        """Until every step has ended, ``seconds`` at most."""
        end = time.monotonic() + seconds
        while any(step.poll() is None for step in self.steps) and time.monotonic() < end:
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGKILL (which the blocked mask does not stop) to this job's Ray, node by node
        (``reap stop --slurm-ray``: the process groups of its `ray start`s, not every Ray of the
        node as `ray stop --force` would): first here, the head's node, which needs no srun (a job
        Slurm is ending, a requeue or scancel, starts no more steps), then on every node by srun;
        each `ray start --block` then exits, and its srun step with it. Where srun cannot start,
        the other nodes' raylets exit on their own once their head is gone (Ray's
        gcs_rpc_server_reconnect_timeout_s, 60 s), or Slurm's SIGKILL ends them KillWait after
        its SIGTERM, whichever comes first."""
        if not self.steps:
            return
        say("slurm: stopping Ray on the job's nodes")
        job = knob("SLURM_JOB_ID")
        stop_slurm_ray(job)
        self._wait(POLL_S)
        cmd = ["srun", "--overlap", f"--nodes={self.nodes}", "--ntasks-per-node=1",
               sys.executable, *REAP_STOP, job]  # fmt: skip
        end = time.monotonic() + 30
        # again every 5 s: a step started just before (a SIGTERM right after the workers' srun)
        # may start its ray after the first stop has run on its node
        while any(step.poll() is None for step in self.steps) and time.monotonic() < end:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=60)  # fmt: skip
            self._wait(min(POLL_S, end - time.monotonic()))
        for step in self.steps:
            if step.poll() is None:
                step.kill()
            step.wait()


def multi_node(root: str, recipe: str, overrides: Sequence[str]) -> int:
    """Several nodes: checks, Ray on every node, a bounded wait until every node's GPUs have
    joined, then the recipe as Ray's driver here (RAY_ADDRESS: the launcher attaches to the
    cluster); Ray is stopped on every node when this ends, whatever the reason."""
    require(MULTI_NODE, ("srun", "scontrol", "squeue"))
    root = repo_root(root)
    path = recipe_path(root, recipe)
    export_defaults()
    nodes = whole("SLURM_JOB_NUM_NODES", "1")
    gpus = knob("GPUS_PER_NODE") or knob("SLURM_GPUS_ON_NODE")
    if not re.fullmatch(r"[0-9]+", gpus) or int(gpus) < 1:
        fail("slurm: GPUs per node unknown (SLURM_GPUS_ON_NODE unset: ask for them with "
             "--gpus-per-node, or set GPUS_PER_NODE)")  # fmt: skip
    port, timeout = whole("RAY_PORT", "6379"), whole("RAY_JOIN_TIMEOUT_S", "300")
    check_shared(knob("RUN_DIR") or knob("RUNS_ROOT") or f"{root}/runs", nodes)
    head = first_word(["scontrol", "show", "hostnames", knob("SLURM_JOB_NODELIST")], "node name")
    where = ["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", head, "hostname", "-I"]
    head_ip = first_word(where, "IP address of the head node")
    ray = knob("RAY") or str(Path(sys.executable).parent / "ray")
    cluster = RayNodes(ray, root, head, head_ip, port, nodes, int(gpus))
    stop = Forwarder()
    stop.install()  # from here a SIGTERM is the recipe's, or ends the job before it starts
    try:
        say_job(f"Ray head on {head} ({cluster.address}), {nodes} node(s) x {gpus} GPU(s)")
        cluster.start(stop)
        have, waited = cluster.join(timeout, stop)
        want = nodes * int(gpus)
        if stop.stopping:
            fail("slurm: SIGTERM before the recipe started: nothing trained, the recipe not "
                 "started", 143)  # fmt: skip
        if have < want:
            fail(f"slurm: after RAY_JOIN_TIMEOUT_S={timeout} s the Ray cluster at "
                 f"{cluster.address} has {have} of {want} GPUs ({nodes} node(s) x {gpus}): "
                 "a node never joined (its ray start output is above); "
                 "nothing was trained")  # fmt: skip
        say_job(f"all {want} GPUs joined in {waited} s: {command_line(root, path, overrides)}")
        os.environ.update(RAY_ADDRESS=cluster.address, NNODES=str(nodes), NDEVICES_PER_NODE=gpus)
        os.environ["DEVICE"] = knob("DEVICE", "gpu")
        os.chdir(root)
        return stop.run(["bash", path, *overrides])
    finally:
        cluster.stop()


def default_root() -> str:
    return knob("VERL_GSM8K_ROOT") or knob("SLURM_SUBMIT_DIR") or os.getcwd()


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.sbatch", description=__doc__, epilog=KNOBS,
        formatter_class=raw,
    )  # fmt: skip
    modes = parser.add_subparsers(dest="mode", required=True, metavar="{one-node,multi-node}")
    for name, (file, what) in MODES.items():
        mode = modes.add_parser(name, help=what, description=f"What {file} runs: {what}.",
                                epilog=KNOBS, formatter_class=raw)  # fmt: skip
        mode.add_argument("--root", default="", help="the repository, given before RECIPE "
                          "(default: VERL_GSM8K_ROOT, else SLURM_SUBMIT_DIR, else the current "
                          "folder)")  # fmt: skip
        mode.add_argument("recipe", nargs="?", default="", metavar="RECIPE",
                          help="the recipe: recipes/<name>.sh, relative to the root")  # fmt: skip
        mode.add_argument("overrides", nargs=argparse.REMAINDER, metavar="key=value ...",
                          help="the recipe's overrides, passed on as they are")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = args.root or default_root()
    if args.mode == "one-node":
        one_node(root, args.recipe, args.overrides)
    return multi_node(root, args.recipe, args.overrides)
