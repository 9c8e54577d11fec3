"""The sbatch files under a fake `srun` and `ray` (real Slurm: test_slurm_nodes_cpu.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT

from verl_gsm8k.common.procs import alive, blocks_sigterm

FAKE_SRUN = """# runs its command here, as each node would: srun's options dropped
while [[ $# -gt 0 && "$1" == -* ]]; do case "$1" in -w|-x) shift 2 ;; *) shift ;; esac; done
exec "$@"
"""
# `ray start` stays up (as sleep), records its pid and arguments; `ray status` counts {gpus} GPUs.
FAKE_RAY = """case "$1" in
  start) echo "$$" >> "{pids}"; echo "$*" >> "{pids}.args"; exec sleep 300 ;;
  status) echo " 0.0/{gpus}.0 GPU" ;;
esac
"""
RECIPE = """trap 'echo "recipe: SIGTERM" >> "{log}"; exit 5' TERM
echo "recipe: started" >> "{log}"
while :; do sleep 0.1; done
"""


def sbatch(name: str, env: dict[str, str], *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(["/bin/bash", str(ROOT / "slurm" / name), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)  # fmt: skip


def finished(name: str, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    job = sbatch(name, env, *args)
    out, err = job.communicate(timeout=60)
    return job.returncode, out, err


def job_env(tmp_path: Path, bins: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in (bins or {"squeue": "exit 0", "scontrol": "exit 0"}).items():
        (folder / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (folder / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base = dict(SLURM_JOB_ID="7", SLURM_JOB_NAME="t", SLURM_JOB_NODELIST="node1",
                SLURM_SUBMIT_DIR=str(ROOT))  # fmt: skip
    env.pop("NDEVICES_PER_NODE", None)
    return {**env, "PYTHON": sys.executable, "PATH": f"{folder}:/usr/bin:/bin", **base, **extra}


@pytest.mark.parametrize("name", ["one_node.sbatch", "multi_node.sbatch"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, name: str):
    outside = job_env(tmp_path, {"sbatch": "exit 0"})
    del outside["SLURM_JOB_ID"]
    nodes = dict(SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="8", RUNS_ROOT=str(tmp_path / "r"))
    cases = [
        (outside, (), f"slurm/{name} is a batch script: submit it, sbatch slurm/{name}"),
        (dict(outside, PATH=str(tmp_path)), (), "no Slurm here (sbatch not found)"),
        (job_env(tmp_path, VERL_GSM8K_ROOT=str(tmp_path)), (), f"{tmp_path} is not this repo"),
        (job_env(tmp_path, PYTHON=str(tmp_path / "py")), (), f"no Python at {tmp_path / 'py'}"),
        (job_env(tmp_path), ("",), "the first argument is the recipe to run"),
        (job_env(tmp_path), ("trainer.total_epochs=5",), "the first argument is the recipe"),
        (job_env(tmp_path), ("recipes/nope.sh",), f"no recipe {ROOT}/recipes/nope.sh"),
    ]
    for env, args, said in cases:
        env.update(nodes)
        code, _, err = finished(name, env, *(args or ("recipes/smoke_tiny.sh",)))
        assert code == 2 and err.count("\n") == 1 and said in err, (said, err)


def test_one_node_execs_the_recipe_on_the_gpus_slurm_gave_it(tmp_path: Path):
    out, recipe = tmp_path / "recipe.out", tmp_path / "recipe.sh"
    recipe.write_text(f'echo "$$ $LOCK_WAIT_S $SLURM_REQUEUE_ON_STOP $NDEVICES_PER_NODE $*" > '
                      f'"{out}"\ngrep SigIgn /proc/$$/status >> "{out}"\n')  # fmt: skip
    env = job_env(tmp_path, SLURM_GPUS_ON_NODE="2")
    job = sbatch("one_node.sbatch", env, str(recipe), "a=1")
    stdout, stderr = job.communicate(timeout=60)
    assert job.returncode == 0, stderr
    said, ignored = out.read_text().splitlines()
    assert said.split() == [str(job.pid), "120", "1", "2", "a=1"]
    assert not int(ignored.split()[1], 16) & (1 << (signal.SIGPIPE - 1))
    knobs = "LOCK_WAIT_S=120, requeue on a stop: 1, NDEVICES_PER_NODE=2 from SLURM_GPUS_ON_NODE"
    assert stdout == f"slurm: job 7 (t) restart 0 on node1: bash {recipe} a=1 ({knobs})\n"
    out.unlink()
    code, _, err = finished("one_node.sbatch", dict(env, NDEVICES_PER_NODE="4"), str(recipe))
    assert code == 2 and err.count("\n") == 1 and "NDEVICES_PER_NODE=4, but Slurm gave" in err
    assert not out.exists()


def several_nodes(tmp_path: Path, recipe: Path, gpus: int = 2, **extra: str) -> subprocess.Popen:
    """Two nodes of one GPU each, `ray status` counting ``gpus``."""
    bins = {"srun": FAKE_SRUN, "squeue": "exit 0",
            "scontrol": '[[ "$1 $2" == "show hostnames" ]] && printf "node1\\nnode2\\n"',
            "ray": FAKE_RAY.format(pids=tmp_path / "ray.pids", gpus=gpus)}  # fmt: skip
    env = job_env(tmp_path, bins, SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="1",
                  SLURM_JOB_NODELIST="node[1-2]", RUNS_ROOT=str(tmp_path / "runs"),
                  RAY=str(tmp_path / "bin" / "ray"), **extra)  # fmt: skip
    recipe.write_text(RECIPE.format(log=tmp_path / "recipe.log"))
    return sbatch("multi_node.sbatch", env, str(recipe), start_new_session=True)


def ray_started(tmp_path: Path, recipe_too: bool = False) -> list[int]:
    pids, log = tmp_path / "ray.pids", tmp_path / "recipe.log"
    ray = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    ready = len(ray) == 2 and (not recipe_too or log.exists() and "started" in log.read_text())
    return ray if ready else []


def wait_for(tmp_path: Path, job: subprocess.Popen, recipe_too: bool = False) -> list[int]:
    end = time.monotonic() + 60
    while not ray_started(tmp_path, recipe_too) and time.monotonic() < end and job.poll() is None:
        time.sleep(0.1)
    return ray_started(tmp_path, recipe_too)


def gone(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


def test_several_nodes_ray_lives_through_a_sigterm_to_the_whole_job_then_is_stopped(
    tmp_path: Path,
):
    job = several_nodes(tmp_path, tmp_path / "recipe.sh", SLURM_CPUS_ON_NODE="4")
    try:
        ray = wait_for(tmp_path, job, recipe_too=True)
        assert len(ray) == 2 and all(blocks_sigterm(pid) for pid in ray), (ray, job.poll())
        for pid in [*ray, job.pid]:  # every process of the job at once, as Slurm does
            os.kill(pid, signal.SIGTERM)
        os.killpg(job.pid, signal.SIGTERM)
        signalled = time.monotonic()
        out, _ = job.communicate(timeout=90)
        ended = time.monotonic() - signalled
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert "recipe: SIGTERM" in (tmp_path / "recipe.log").read_text()
    assert job.returncode == 5, (job.returncode, out)  # the recipe's status
    assert gone(ray) and ended < 20, (ended, out)  # by the stop of the job's Ray, not 30 s
    assert "slurm: Ray of job 7 on " in out and ": 2 processes stopped (2x sleep)" in out, out
    for args in Path(f"{tmp_path}/ray.pids.args").read_text().splitlines():
        assert "--block" in args and "--num-gpus=1" in args and "--num-cpus=4" in args, args
    bins = {"srun": 'echo "missing node2"; echo ok', "squeue": "exit 0", "scontrol": "exit 0"}
    env = job_env(tmp_path, bins, SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="8",
                  RUNS_ROOT=str(tmp_path / "elsewhere"))  # fmt: skip
    code, _, err = finished("multi_node.sbatch", env, "recipes/smoke_tiny.sh")
    assert code == 2 and "is not on storage every node mounts (not seen on node2)" in err, err
    assert not list((tmp_path / "elsewhere").glob(".slurm-shared-check-*"))


def test_several_nodes_a_sigterm_before_the_recipe_or_a_node_that_never_joins(tmp_path: Path):
    for timeout, status, said in (
        ("300", 143, "slurm: SIGTERM before the recipe started: nothing trained"),
        ("0", 2, "has 1 of 2 GPUs (2 node(s) x 1): a node never joined"),
    ):
        (tmp_path / "ray.pids").unlink(missing_ok=True)
        job = several_nodes(tmp_path, tmp_path / "recipe.sh", gpus=1, RAY_JOIN_TIMEOUT_S=timeout)
        try:
            ray = wait_for(tmp_path, job)
            if status == 143:
                assert len(ray) == 2 and job.poll() is None, job.poll()
                os.kill(job.pid, signal.SIGTERM)  # the batch process alone: `B:TERM`
            out, err = job.communicate(timeout=60)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        assert job.returncode == status, (job.returncode, out, err)
        assert err.count(said) == 1 and "slurm: stopping Ray on the job's nodes" in out, out
        started = [int(pid) for pid in (tmp_path / "ray.pids").read_text().split()]
        assert started and gone(started) and not (tmp_path / "recipe.log").exists()
