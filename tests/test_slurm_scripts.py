"""The sbatch files and what they exec (verl_gsm8k/sbatch/cli.py), without Slurm running: bad
input, one line each (outside a job, with no Slurm installed, not the repository, no Python, a
first argument that is not a recipe, and with several nodes a run directory some node cannot
see), the one-node exec, and Ray over several nodes under a fake `srun` that runs each node's
command here and a fake `ray`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from helpers import ROOT


def sbatch_file(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", str(ROOT / "slurm" / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHON"] = sys.executable  # the sbatch files' interpreter: the one running the tests
    return dict(env, **extra)


def fake_bin(folder: Path, **scripts: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (folder / name).chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


def test_outside_a_job_one_line(tmp_path: Path):
    # sbatch installed: submit it; no sbatch at all: no Slurm here
    with_sbatch = fake_bin(tmp_path / "with", sbatch="exit 0")
    for name in ("one_node.sbatch", "multi_node.sbatch"):
        done = sbatch_file(name, plain_env(PATH=with_sbatch), "recipes/smoke_tiny.sh")
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"slurm/{name} is a batch script: submit it, sbatch slurm/{name}" in done.stderr
    bare = fake_bin(tmp_path / "bare").split(":")[0]  # bash builtins only: no sbatch anywhere
    done = sbatch_file("one_node.sbatch", plain_env(PATH=bare), "recipes/smoke_tiny.sh")
    assert done.returncode == 2 and "no Slurm here (sbatch not found)" in done.stderr


def test_not_the_repository_or_no_python_one_line(tmp_path: Path):
    python = tmp_path / "python"
    for name in ("one_node.sbatch", "multi_node.sbatch"):
        for env, said in (
            (plain_env(VERL_GSM8K_ROOT=str(tmp_path)), f"slurm: {tmp_path} is not this repository"),
            (plain_env(PYTHON=str(python)), f"slurm: no Python at {python}"),
        ):
            done = sbatch_file(name, env, "recipes/smoke_tiny.sh")
            assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
            assert said in done.stderr, done.stderr


def test_one_node_execs_the_recipe_as_the_batch_process(tmp_path: Path):
    """The batch shell's pid becomes the recipe's (exec all the way: Slurm's `--signal=B:TERM`
    reaches the recipe's launcher), with the job's knobs and the default SIGPIPE."""
    path = fake_bin(tmp_path / "bin", squeue="exit 0", scontrol="exit 0")
    out, recipe = tmp_path / "recipe.out", tmp_path / "recipe.sh"
    recipe.write_text(f'echo "$$ $LOCK_WAIT_S $SLURM_REQUEUE_ON_STOP $*" > "{out}"\n'
                      f'grep SigIgn /proc/$$/status >> "{out}"\n')  # fmt: skip
    env = plain_env(PATH=path, SLURM_JOB_ID="7", SLURM_JOB_NAME="t", SLURM_JOB_NODELIST="node1",
                    SLURM_SUBMIT_DIR=str(ROOT))  # fmt: skip
    job = subprocess.Popen(["/bin/bash", str(ROOT / "slurm" / "one_node.sbatch"), str(recipe),
                            "a=1"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    stdout, stderr = job.communicate(timeout=60)
    assert job.returncode == 0, stderr
    said, ignored = out.read_text().splitlines()
    assert said.split() == [str(job.pid), "120", "1", "a=1"]
    assert not int(ignored.split()[1], 16) & (1 << (signal.SIGPIPE - 1))
    assert stdout == (f"slurm: job 7 (t) restart 0 on node1: bash {recipe} a=1 "
                      "(LOCK_WAIT_S=120, requeue on a stop: 1)\n")  # fmt: skip


def test_one_node_trains_on_the_gpus_slurm_gave_it(tmp_path: Path):
    """--gpus-per-node=2 sets SLURM_GPUS_ON_NODE=2: the recipe gets NDEVICES_PER_NODE=2; a
    NDEVICES_PER_NODE asking for another number is one line, exit 2, the recipe never run."""
    path = fake_bin(tmp_path / "bin", squeue="exit 0", scontrol="exit 0")
    out, recipe = tmp_path / "recipe.out", tmp_path / "recipe.sh"
    recipe.write_text(f'echo "$NDEVICES_PER_NODE" > "{out}"\n')
    env = plain_env(PATH=path, SLURM_JOB_ID="7", SLURM_JOB_NAME="t", SLURM_JOB_NODELIST="node1",
                    SLURM_SUBMIT_DIR=str(ROOT), SLURM_GPUS_ON_NODE="2")  # fmt: skip
    env.pop("NDEVICES_PER_NODE", None)
    done = sbatch_file("one_node.sbatch", env, str(recipe))
    assert done.returncode == 0, done.stderr
    assert out.read_text().strip() == "2"
    assert done.stdout.rstrip().endswith(", NDEVICES_PER_NODE=2 from SLURM_GPUS_ON_NODE)")
    out.unlink()
    done = sbatch_file("one_node.sbatch", dict(env, NDEVICES_PER_NODE="4"), str(recipe))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "NDEVICES_PER_NODE=4, but Slurm gave this job 2 GPU(s)" in done.stderr
    assert not out.exists()


def test_the_first_argument_must_be_a_recipe(tmp_path: Path):
    path = fake_bin(tmp_path / "bin", squeue="exit 0", scontrol="exit 0")
    env = plain_env(PATH=path, SLURM_JOB_ID="7", SLURM_SUBMIT_DIR=str(ROOT))
    for args, said in (
        ((), "the first argument is the recipe to run"),
        (("trainer.total_epochs=5",), "the first argument is the recipe to run"),
        (("recipes/nope.sh",), f"no recipe {ROOT}/recipes/nope.sh"),
    ):
        done = sbatch_file("one_node.sbatch", env, *args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr


def test_several_nodes_refuse_a_run_directory_a_node_cannot_see(tmp_path: Path):
    # the fake srun runs the check as a node whose /tmp is its own: the file is not there
    srun = 'if [[ "$*" == *slurm-shared-check* ]]; then echo "missing node2"; echo ok; fi'
    path = fake_bin(tmp_path / "bin", srun=srun, squeue="exit 0", scontrol="exit 0")
    runs = tmp_path / "runs"
    nodes = dict(SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="8", RUNS_ROOT=str(runs))
    env = plain_env(PATH=path, SLURM_JOB_ID="7", SLURM_SUBMIT_DIR=str(ROOT), **nodes)
    done = sbatch_file("multi_node.sbatch", env, "recipes/smoke_tiny.sh")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"slurm: {runs} is not on storage every node mounts (not seen on node2)" in done.stderr
    assert not list(runs.glob(".slurm-shared-check-*"))  # the probe file is removed


FAKE_SRUN = """# runs its command here, as each node would: srun's options dropped
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in -w|-x) shift 2 ;; *) shift ;; esac
done
exec "$@"
"""

FAKE_RAY = """# `ray start` stays up (as sleep, with the mask and session it was given), records its
# pid and arguments; `ray status` shows {gpus} GPUs joined. No `ray stop`: the teardown ends
# the job's `ray start` process groups itself (reap stop --slurm-ray)
case "$1" in
  start) echo "$$" >> "{pids}"; echo "$*" >> "{pids}.args"; exec sleep 300 ;;
  status) echo " 0.0/{gpus}.0 GPU" ;;
esac
"""

RECIPE = """trap 'echo "recipe: SIGTERM" >> "{log}"; exit 5' TERM
echo "recipe: started" >> "{log}"
while :; do sleep 0.1; done
"""


def sigterm_blocked(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError(f"no SigBlk for pid {pid}")


def several_nodes(tmp_path: Path, recipe: Path, gpus: int = 2, **extra: str) -> subprocess.Popen:
    """slurm/multi_node.sbatch on two nodes of one GPU each, under the fake srun and a fake ray
    whose `ray status` counts ``gpus`` GPUs."""
    path = fake_bin(tmp_path / "bin", srun=FAKE_SRUN, squeue="exit 0",
                    scontrol='[[ "$1 $2" == "show hostnames" ]] && printf "node1\\nnode2\\n"',
                    ray=FAKE_RAY.format(pids=tmp_path / "ray.pids", gpus=gpus))  # fmt: skip
    nodes = dict(SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="1", SLURM_JOB_NODELIST="node[1-2]",
                 RUNS_ROOT=str(tmp_path / "runs"), RAY=str(tmp_path / "bin" / "ray"))  # fmt: skip
    env = plain_env(PATH=path, SLURM_JOB_ID="7", SLURM_SUBMIT_DIR=str(ROOT), **nodes, **extra)
    return subprocess.Popen(["/bin/bash", str(ROOT / "slurm" / "multi_node.sbatch"), str(recipe)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


def ray_started(pids: Path) -> list[int]:
    """The pids of both nodes' `ray start`, once both have started."""
    ray = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    return ray if len(ray) == 2 else []


def gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in pids)  # fmt: skip


def test_several_nodes_ray_lives_through_a_sigterm_to_the_whole_job_then_is_stopped(
    tmp_path: Path,
):
    """Slurm's time limit without `B:`, a preemption or `scancel` signal every process of the
    job: the batch process (which passes it to the recipe: save, then stop) and each node's
    `ray start` step, whose raylet would take the node's workers down before the save. Under a
    fake srun (each node's command run here) and a fake `ray`: both `ray start`s block SIGTERM,
    live through it, and are ended by the teardown once the recipe has stopped. Each is given
    the job's CPUs (SLURM_CPUS_ON_NODE) and GPUs."""
    pids, log = tmp_path / "ray.pids", tmp_path / "recipe.log"
    recipe = tmp_path / "recipe.sh"
    recipe.write_text(RECIPE.format(log=log))
    job = several_nodes(tmp_path, recipe, SLURM_CPUS_ON_NODE="4")
    try:

        def up() -> list[int]:  # both nodes' `ray start` and the recipe
            started = log.exists() and "started" in log.read_text()
            return ray_started(pids) if started else []

        end = time.monotonic() + 60
        while not up() and time.monotonic() < end and job.poll() is None:
            time.sleep(0.1)
        ray = up()
        assert len(ray) == 2, (ray, job.poll(), job.poll() is not None and job.communicate()[0])
        assert all(sigterm_blocked(pid) for pid in ray), ray
        for pid in [*ray, job.pid]:  # every process of the job at once, as Slurm does
            os.kill(pid, signal.SIGTERM)
        os.killpg(job.pid, signal.SIGTERM)
        signalled = time.monotonic()
        out, _ = job.communicate(timeout=90)
        ended = time.monotonic() - signalled
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert "recipe: SIGTERM" in log.read_text()  # the recipe got it: it saves, then stops
    assert job.returncode == 5, (job.returncode, out, log.read_text())  # the recipe's status
    assert "slurm: stopping Ray on the job's nodes" in out
    assert gone(ray), out
    assert ended < 20, (ended, out)  # by the stop of the job's Ray, not the 30 s fallback
    assert "slurm: Ray of job 7 on " in out and ": 2 processes stopped (2x sleep)" in out, out
    for args in Path(f"{pids}.args").read_text().splitlines():
        assert "--block" in args and "--num-gpus=1" in args and "--num-cpus=4" in args, args


def test_several_nodes_a_sigterm_before_the_recipe_or_a_node_that_never_joins(tmp_path: Path):
    """Ray counts one GPU of two: a SIGTERM during the wait ends the job at once, the recipe not
    started (143); without it, RAY_JOIN_TIMEOUT_S ends it (2). Ray is stopped after either."""
    log = tmp_path / "recipe.log"
    recipe = tmp_path / "recipe.sh"
    recipe.write_text(RECIPE.format(log=log))
    for timeout, status, said in (
        ("300", 143, "slurm: SIGTERM before the recipe started: nothing trained"),
        ("0", 2, "has 1 of 2 GPUs (2 node(s) x 1): a node never joined"),
    ):
        pids = tmp_path / "ray.pids"
        pids.unlink(missing_ok=True)
        job = several_nodes(tmp_path, recipe, gpus=1, RAY_JOIN_TIMEOUT_S=timeout)
        try:
            end = time.monotonic() + 60
            while not ray_started(pids) and time.monotonic() < end and job.poll() is None:
                time.sleep(0.1)
            ray = ray_started(pids)
            if status == 143:
                assert len(ray) == 2 and job.poll() is None, job.poll()
                os.kill(job.pid, signal.SIGTERM)  # the batch process alone: `B:TERM`
            out, _ = job.communicate(timeout=60)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        assert job.returncode == status, (job.returncode, out)
        assert out.count(said) == 1 and "slurm: stopping Ray on the job's nodes" in out, out
        started = [int(pid) for pid in pids.read_text().split()]  # the head's at least
        assert started and gone(started) and not log.exists(), (started, out)
