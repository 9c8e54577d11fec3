"""What slurm/*.sbatch exec inside a Slurm job (docs/slurm.md):

    python -m verl_gsm8k.sbatch one-node RECIPE [key=value ...]
    python -m verl_gsm8k.sbatch multi-node RECIPE [key=value ...]

Bad input is one line starting ``slurm:``, exit 2.
"""

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
from pathlib import Path
from typing import NoReturn

from verl_gsm8k.launch.reap import ENV_RAY_OF_JOB, stop_slurm_ray

MARKER = "verl_gsm8k/sbatch/cli.py"  # what tells the repository's root
REAP = ("-m", "verl_gsm8k.launch.reap")  # each `ray start` run by it, each node's Ray ended by it
POLL_S = 5.0  # the join's polling period, and the head's head start
MODES = {
    "one-node": "checks, then exec's the recipe: the job's batch process, Slurm's signals its",
    "multi-node": "Ray on the job's nodes, the recipe its driver on the first, SIGTERM passed on "
    "to it, Ray stopped on every node at the end",
}
KNOBS = """environment variables (empty counts as unset, as in the recipes):
  LOCK_WAIT_S (120 here)     a requeued start waits for the previous one's processes, then refuses
  SLURM_REQUEUE_ON_STOP (1)  a launch that stopped after saving requeues its job
  VERL_GSM8K_ROOT            the repository (default: SLURM_SUBMIT_DIR, else the current folder)
  PYTHON                     the interpreter, on every node (default: <root>/.venv/bin/python)
  SLURM_GPUS_ON_NODE         set by Slurm: one-node's NDEVICES_PER_NODE (no other number)
multi-node only:
  GPUS_PER_NODE              GPUs per node (default: SLURM_GPUS_ON_NODE)
  RAY_PORT (6379)            the Ray head's port
  RAY_JOIN_TIMEOUT_S (300)   how long to wait for every node's GPUs to join Ray
  RAY                        the ray command (default: the one beside this Python)
  SLURM_CPUS_ON_NODE         set by Slurm: each `ray start --num-cpus` (else all the node's)
  RUN_DIR, RUNS_ROOT         checked to be on storage every node mounts (RUNS_ROOT=<root>/runs)
"""


def knob(name: str, default: str = "") -> str:
    return os.environ.get(name) or default


def fail(line: str, status: int = 2) -> NoReturn:
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(status)


def say(line: str) -> None:
    print(line, flush=True)  # the job's output file holds other processes' lines too


def whole(name: str, default: str) -> int:
    if not re.fullmatch(r"[0-9]+", value := knob(name, default)):
        fail(f"slurm: {name}={value} is not a whole number")
    return int(value)


def prepare(file: str, tools: Sequence[str], root: str, recipe: str) -> str:
    """Inside a job, with Slurm's commands, in this repository: the recipe's path."""
    job = knob("SLURM_JOB_ID")
    if not job and shutil.which("sbatch") is None:
        fail(f"slurm: no Slurm here (sbatch not found): {file} runs under Slurm (docs/slurm.md);"
             " without Slurm run the recipe itself: bash recipes/<recipe>.sh")  # fmt: skip
    if not job:
        fail(f"slurm: {file} is a batch script: submit it, sbatch {file} recipes/<recipe>.sh "
             "[key=value ...] (docs/slurm.md)")  # fmt: skip
    for tool in tools:
        if shutil.which(tool) is None:
            fail(f"slurm: {tool} not found on {socket.gethostname().split('.')[0]} inside job "
                 f"{job}: {file} needs Slurm's client commands on the compute nodes")  # fmt: skip
    if not Path(root, MARKER).is_file():  # sbatch runs a copy of the file from its spool
        fail(f"slurm: {root} is not this repository (no {MARKER}): submit from the repository's "
             "root, or set VERL_GSM8K_ROOT")  # fmt: skip
    if not recipe or "=" in recipe:
        fail("slurm: the first argument is the recipe to run (recipes/<name>.sh), its key=value "
             f"overrides after it; got '{recipe}'")  # fmt: skip
    path = recipe if recipe.startswith("/") else f"{root}/{recipe}"
    if not Path(path).is_file():
        fail(f"slurm: no recipe {path} (the first argument: recipes/<name>.sh)")
    os.environ["LOCK_WAIT_S"] = knob("LOCK_WAIT_S", "120")
    os.environ["SLURM_REQUEUE_ON_STOP"] = knob("SLURM_REQUEUE_ON_STOP", "1")
    return path


def say_job(what: str) -> None:
    host = knob("SLURM_JOB_NODELIST") or socket.gethostname().split(".")[0]
    say(f"slurm: job {knob('SLURM_JOB_ID')} ({knob('SLURM_JOB_NAME')}) restart "
        f"{knob('SLURM_RESTART_COUNT', '0')} on {host}: {what}")  # fmt: skip


def one_node(root: str, recipe: str, overrides: Sequence[str]) -> NoReturn:
    """exec the recipe, so that `--signal=B:TERM@N` reaches its launcher."""
    path = prepare("slurm/one_node.sbatch", ("squeue", "scontrol"), root, recipe)
    gpus, asked, said = knob("SLURM_GPUS_ON_NODE"), knob("NDEVICES_PER_NODE"), ""
    if re.fullmatch(r"[1-9][0-9]*", gpus):
        if asked and asked != gpus:
            fail(f"slurm: NDEVICES_PER_NODE={asked}, but Slurm gave this job {gpus} GPU(s) on "
                 f"its node (SLURM_GPUS_ON_NODE): submit with --gpus-per-node={asked}, or leave "
                 "NDEVICES_PER_NODE unset")  # fmt: skip
        os.environ["NDEVICES_PER_NODE"] = gpus
        said = f", NDEVICES_PER_NODE={gpus} from SLURM_GPUS_ON_NODE"
    os.chdir(root)
    say_job(f"bash {path.removeprefix(root + '/')} {' '.join(overrides)} (LOCK_WAIT_S="
            f"{os.environ['LOCK_WAIT_S']}, requeue on a stop: "
            f"{os.environ['SLURM_REQUEUE_ON_STOP']}{said})")  # fmt: skip
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python's ignored ones would stay ignored
        signal.signal(sig, signal.SIG_DFL)
    os.execvp("bash", ["bash", path, *overrides])


def check_shared(base: str, nodes: int) -> None:
    token = Path(base, f".slurm-shared-check-{knob('SLURM_JOB_ID')}")
    try:
        token.parent.mkdir(parents=True, exist_ok=True)
        token.write_bytes(b"")
    except OSError as err:
        fail(f"slurm: cannot write in {base}: {err.strerror}")
    probe = f'[[ -e {shlex.quote(str(token))} ]] && echo ok || echo "missing $(hostname -s)"'
    try:
        lines = first_words(["srun", "--overlap", f"--nodes={nodes}", "--ntasks-per-node=1",
                             "bash", "-c", probe], check=False)  # fmt: skip
    finally:
        token.unlink(missing_ok=True)
    missing = [line.removeprefix("missing ") for line in lines if line.startswith("missing ")]
    if missing or "ok" not in lines:
        where = ",".join(f"not seen on {name}" for name in missing)
        fail(f"slurm: {base} is not on storage every node mounts ({where}): every node writes "
             "its ranks' checkpoint shards there; set RUNS_ROOT (or RUN_DIR) to a shared "
             "filesystem (docs/slurm.md)")  # fmt: skip


def first_words(cmd: Sequence[str], what: str = "", check: bool = True) -> list[str]:
    """The lines ``cmd`` prints; with ``check``, exit 2 when it fails or prints none."""
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        status, lines = done.returncode, done.stdout.split("\n")
    except OSError:
        status, lines = 127, []
    lines = [line.strip() for line in lines if line.strip()]
    if check and (status != 0 or not lines):
        fail(f"slurm: no {what} from `{shlex.join(cmd)}` (exit {status})")
    return lines


class Job:
    """Ray on the job's nodes (a `ray start --block` step a node, SIGTERM blocked: the cluster
    outlives a SIGTERM to the whole job), the recipe its driver here, a SIGTERM passed on to it."""

    def __init__(self, ray: str, root: str, head: str, address: str, gpus: int) -> None:
        self.ray, self.root, self.head, self.address, self.gpus = ray, root, head, address, gpus
        self.steps: list[subprocess.Popen[bytes]] = []
        self.driver: subprocess.Popen[bytes] | None = None
        self.stopping = False
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, *_: object) -> None:
        self.stopping = True
        with contextlib.suppress(ProcessLookupError, AttributeError):
            self.driver.send_signal(signal.SIGTERM)  # type: ignore[union-attr]

    def pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(0.2)

    def start_ray(self, where: Sequence[str], *args: str) -> None:
        ray = [self.ray, "start", *args, "--block", f"--num-gpus={self.gpus}"]
        if re.fullmatch(r"[1-9][0-9]*", cpus := knob("SLURM_CPUS_ON_NODE")):
            ray.append(f"--num-cpus={cpus}")  # the job's CPUs, not every CPU of the node
        remote = [f"--chdir={self.root}", sys.executable, *REAP, "exec", "--", *ray]
        env = dict(os.environ, **{ENV_RAY_OF_JOB: knob("SLURM_JOB_ID")})  # srun passes it on
        self.steps.append(subprocess.Popen(["srun", "--overlap", *where, *remote], env=env))

    def gpus_joined(self) -> int:
        """The GPUs `ray status` counts, 0 when it does not answer."""
        try:
            out = subprocess.run([self.ray, "status", "--address", self.address],
                                 capture_output=True, text=True, timeout=60).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return 0
        found = re.search(r"^ *[0-9.]*/([0-9]+)[0-9.]* GPU", out, re.M)
        return int(found.group(1)) if found else 0

    def run(self, argv: Sequence[str]) -> int:
        """The recipe's status (128+N for a signal N), whatever signals come meanwhile."""
        self.driver = subprocess.Popen(argv)
        if self.stopping:  # the SIGTERM came while it was being started
            self._on_sigterm()
        status = self.driver.wait()
        return 128 - status if status < 0 else status

    def stop(self, nodes: int) -> None:
        """SIGKILL to this job's Ray node by node (`reap stop --slurm-ray`), here then by srun."""
        if not self.steps:
            return
        say("slurm: stopping Ray on the job's nodes")
        job = knob("SLURM_JOB_ID")
        stop_slurm_ray(job)
        cmd = ["srun", "--overlap", f"--nodes={nodes}", "--ntasks-per-node=1", sys.executable,
               *REAP, "stop", "--slurm-ray", job]  # fmt: skip
        end, first = time.monotonic() + 30, True
        while time.monotonic() < end and any(step.poll() is None for step in self.steps):
            if not first:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=60)  # fmt: skip
            wait = time.monotonic() + min(POLL_S, end - time.monotonic())
            while time.monotonic() < wait and any(step.poll() is None for step in self.steps):
                time.sleep(0.2)
            first = False
        for step in self.steps:
            if step.poll() is None:
                step.kill()
            step.wait()


def multi_node(root: str, recipe: str, overrides: Sequence[str]) -> int:
    """Ray on every node, a bounded wait for its GPUs, the recipe; Ray stopped at the end."""
    path = prepare("slurm/multi_node.sbatch", ("srun", "scontrol", "squeue"), root, recipe)
    nodes = whole("SLURM_JOB_NUM_NODES", "1")
    gpus = knob("GPUS_PER_NODE") or knob("SLURM_GPUS_ON_NODE")
    if not re.fullmatch(r"[1-9][0-9]*", gpus):
        fail("slurm: GPUs per node unknown (SLURM_GPUS_ON_NODE unset: ask for them with "
             "--gpus-per-node, or set GPUS_PER_NODE)")  # fmt: skip
    port, timeout = whole("RAY_PORT", "6379"), whole("RAY_JOIN_TIMEOUT_S", "300")
    check_shared(knob("RUN_DIR") or knob("RUNS_ROOT") or f"{root}/runs", nodes)
    head = first_words(["scontrol", "show", "hostnames", knob("SLURM_JOB_NODELIST")],
                       "node name")[0].split()[0]  # fmt: skip
    ip = first_words(["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", head, "hostname",
                      "-I"], "IP address of the head node")[0].split()[0]  # fmt: skip
    ray = knob("RAY") or str(Path(sys.executable).parent / "ray")
    job = Job(ray, root, head, f"{ip}:{port}", int(gpus))  # a SIGTERM from here is the job's
    want = nodes * int(gpus)
    try:
        say_job(f"Ray head on {head} ({job.address}), {nodes} node(s) x {gpus} GPU(s)")
        job.start_ray(("--nodes=1", "--ntasks=1", "-w", head), "--head",
                      f"--node-ip-address={ip}", f"--port={port}")  # fmt: skip
        if nodes > 1:
            job.pause(POLL_S)  # the head's head start
            if not job.stopping:
                others = (f"--nodes={nodes - 1}", f"--ntasks={nodes - 1}", "--ntasks-per-node=1")
                job.start_ray((*others, "-x", head), f"--address={job.address}")
        start = time.monotonic()
        while (have := job.gpus_joined()) < want and not job.stopping:
            if time.monotonic() - start >= timeout:
                fail(f"slurm: after RAY_JOIN_TIMEOUT_S={timeout} s the Ray cluster at "
                     f"{job.address} has {have} of {want} GPUs ({nodes} node(s) x {gpus}): a "
                     "node never joined (its ray start output is above); nothing was "
                     "trained")  # fmt: skip
            job.pause(POLL_S)
        if job.stopping:
            fail("slurm: SIGTERM before the recipe started: nothing trained, the recipe not "
                 "started", 143)  # fmt: skip
        rel = path.removeprefix(root + "/")
        say_job(f"all {want} GPUs joined in {time.monotonic() - start:.0f} s: bash {rel} "
                f"{' '.join(overrides)}")  # fmt: skip
        os.environ.update(RAY_ADDRESS=job.address, NNODES=str(nodes), NDEVICES_PER_NODE=gpus,
                          DEVICE=knob("DEVICE", "gpu"))  # fmt: skip
        os.chdir(root)
        return job.run(["bash", path, *overrides])
    finally:
        job.stop(nodes)


def main(argv: Sequence[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.sbatch", description=__doc__,
                                     epilog=KNOBS, formatter_class=raw)  # fmt: skip
    modes = parser.add_subparsers(dest="mode", required=True, metavar="{one-node,multi-node}")
    for name, what in MODES.items():
        mode = modes.add_parser(name, help=what, description=f"slurm/{name.replace('-', '_')}"
                                f".sbatch: {what}.", epilog=KNOBS, formatter_class=raw)  # fmt: skip
        mode.add_argument("--root", default="", help="the repository, given before RECIPE "
                          "(default: VERL_GSM8K_ROOT, else SLURM_SUBMIT_DIR, else the current "
                          "folder)")  # fmt: skip
        mode.add_argument("recipe", nargs="?", default="", metavar="RECIPE",
                          help="the recipe: recipes/<name>.sh, relative to the root")  # fmt: skip
        mode.add_argument("overrides", nargs=argparse.REMAINDER, metavar="key=value ...",
                          help="the recipe's overrides, passed on as they are")  # fmt: skip
    args = parser.parse_args(argv)
    root = args.root or knob("VERL_GSM8K_ROOT") or knob("SLURM_SUBMIT_DIR") or os.getcwd()
    if args.mode == "one-node":
        one_node(root, args.recipe, args.overrides)
    return multi_node(root, args.recipe, args.overrides)
