"""The sbatch files' bad input, one line each, without Slurm running (slurm/common.sh): outside a
job, with no Slurm installed, a first argument that is not a recipe, and (several nodes) a run
directory some node cannot see, under a fake `srun` that runs its command as another node would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import ROOT


def sbatch_file(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", str(ROOT / "slurm" / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
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
