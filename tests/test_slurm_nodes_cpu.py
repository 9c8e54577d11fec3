"""Several nodes under a real Slurm: `slurm/multi_node.sbatch` on two nodes (two node names on this
one machine, each its own slurmd: tests/slurm_local.py) runs the smoke recipe over a Ray cluster
(its head on n1, a worker on n2; one logical GPU a node, FSDP over both), is requeued by Slurm
during step 1, then shrunk to one node and resumed there.

1. The requeue. The trainer is held right before step 1's rollout; `scontrol requeuehold` (a
   requeue, as a preemption with PreemptMode=REQUEUE does, held so that the test can shrink the
   job before it starts again) has Slurm send SIGTERM to every process of the job on both nodes:
   the batch process passes it to the launcher, each node's Ray (started with SIGTERM blocked)
   and the cluster's workers (which carry the launch's variables) live through it, vLLM's
   engines ignore it, the step in flight is saved by both FSDP ranks, the launcher exits 5 and
   says Slurm requeued the job. Then Ray is stopped on the nodes although `srun` no longer starts
   in a job Slurm is ending (`reap stop --slurm-ray`, on the head's node itself): nothing of the
   job is left, and the job leaves COMPLETING at once rather than at Slurm's SIGKILL, KillWait
   (120 s) after its SIGTERM.
2. A node lost. The requeued job is given one node (`scontrol update`) and released:
   its second start runs Ray on one node, the launcher sees only the world size changed and
   reshards step 1's two-rank checkpoint for one rank (verl_gsm8k/reshard/) before verl starts,
   and step 2 ends the run. Every step is logged once across the two starts.

Two verl launches (docs/testing.md, "The budget rule"). The suite's one run of the multi-node
sbatch file under a real Slurm; its control flow under a fake srun and ray is in
tests/test_slurm_scripts.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import ROOT
from slurm_local import Cluster, require_slurm, slurm_cluster
from test_slurm_cpu import wait_for
from test_train_cpu import ONE_SMALL_STEP, TRAIN_TIMEOUT_S, cpu_env, metric_segments

from verl_gsm8k.common.run_dir import TRACKER
from verl_gsm8k.launch.reap import launch_processes, of_run_dir, slurm_ray_groups

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# Each node claims 8 CPUs (config_overrides): Ray's `ray start --num-cpus` is the job's
# SLURM_CPUS_ON_NODE, and the CPU run's workers need more than this machine's two
NODE_CPUS = 8
ARGS = ("trainer.val_before_train=False", "data.val_max_samples=8")
KILL_WAIT_S = 120  # tests/slurm_local.py
HELD = ("PENDING", "REQUEUE_HOLD", "REQUEUED")  # scontrol's words once COMPLETING is over


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory):
    require_slurm()
    with slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2, cpus=NODE_CPUS) as running:
        yield running


def test_a_two_node_job_requeued_by_slurm_saves_its_step_then_resumes_on_one_node(
    two_nodes: Cluster, tmp_path: Path
):
    cluster = two_nodes
    runs = tmp_path / "runs"
    run_dir = runs / "smoke_tiny"
    out = tmp_path / "job.out"
    held = tmp_path / "paused-before-rollout"
    knobs = dict(ONE_SMALL_STEP, TOTAL_TRAINING_STEPS="2", SAVE_FREQ="100", TEST_FREQ="100")
    # GPUS_PER_NODE: one logical GPU a node for Ray (the job asks Slurm for none); Ray's worker
    # prestart off: fewer idle workers on this two-core machine
    env = cpu_env(tmp_path / "home", runs, **knobs, GPUS_PER_NODE="1",
                  GSM8K_PAUSE_AT="rollout:1", GSM8K_PAUSE_FILE=str(held),
                  RAY_enable_worker_prestart="0", RAY_prestart_worker_first_driver="0",
                  **cluster.env)  # fmt: skip
    submit = [
        "sbatch", "--parsable", "--nodes=2", "--gpus-per-node=0",
        f"--cpus-per-task={cluster.cpus}", "--time=30", f"--output={out}",
        str(ROOT / "slurm" / "multi_node.sbatch"), "recipes/smoke_tiny.sh", *ARGS,
    ]  # fmt: skip
    started = time.monotonic()
    submitted = cluster.run(*submit, env=env, cwd=ROOT)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    def text() -> str:
        return out.read_text(errors="replace") if out.exists() else ""

    def state() -> str:
        return cluster.job(job).get("JobState", "")

    # 1. step 1's rollout held on two nodes; the requeue signals every process of the job
    wait_for("step 1's rollout held", held.exists, cluster, job, out, TRAIN_TIMEOUT_S)
    requeued = cluster.run("scontrol", "requeuehold", job)
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    signalled = time.monotonic()
    wait_for("the requeue's SIGTERM", lambda: "recipe: SIGTERM:" in text(), cluster, job, out, 120)
    held.unlink()  # step 1 goes on

    def stopped() -> bool:  # held after the requeue, every process of the first start gone
        return "stopping Ray on the job's nodes" in text() and state() in HELD

    wait_for("the first start's end", stopped, cluster, job, out, TRAIN_TIMEOUT_S)
    ended = time.monotonic() - signalled
    first = text()
    # nothing of the job left on either node: its Ray sessions, the launch's processes
    assert slurm_ray_groups(job) == set()
    assert [p.pid for p in launch_processes(of_run_dir(str(run_dir)))] == []
    saved = run_dir / "global_step_1"
    assert f"recipe: stopped on SIGTERM after saving step 1 ({saved})" in first, first[-6000:]
    assert f"recipe: Slurm requeued job {job} itself (restart 1: " in first, first[-6000:]
    grace = f"5 s before Slurm's SIGKILL, KillWait {KILL_WAIT_S} s after its requeue of job {job}"
    assert grace in first, first[-6000:]
    # Ray on both nodes, each given the job's CPUs; the cluster's workers lived through the
    # SIGTERM (they carry the launch's variables), vLLM's engines too
    assert "preflight: [ok] gpu: Ray cluster at " in first and ": 2 node(s), 2 GPU(s)" in first
    assert "SIGTERM to vLLM's EngineCore" in first and "outside the launch: ignored" in first
    for role in ("actor", "critic"):  # FSDP over the two nodes: every rank's files
        for kind in ("model", "optim", "extra_state"):
            for rank in (0, 1):
                assert (saved / role / f"{kind}_world_size_2_rank_{rank}.pt").is_file()
    # Ray stopped by the batch process on its own node, though srun no longer starts: the job
    # left COMPLETING with the launcher's end, not at Slurm's SIGKILL KillWait after its SIGTERM
    # (without that stop: 120 s or more, whatever the machine; the step and its save are in
    # `ended` too, and a SIGKILL would have cut the save)
    assert ended < KILL_WAIT_S, (ended, first[-6000:])
    assert f"slurm: Ray of job {job} on " in first and " 0 processes stopped" not in first

    # 2. one node lost: the requeued job shrunk to one node (its task count first: Slurm keeps
    #    the two tasks and their CPUs of `--nodes=2 --ntasks-per-node=1` otherwise, and starts it
    #    on two nodes again), released; it reshards and ends
    shrink = (
        ("update", f"JobId={job}", "NumTasks=1"),
        ("update", f"JobId={job}", "NumNodes=1", f"NumCPUs={cluster.cpus}"),
        ("release", job),
    )
    for change in shrink:
        done = cluster.run("scontrol", *change)
        assert done.returncode == 0, done.stdout + done.stderr
    wait_for("the second start's end", lambda: state() in ("COMPLETED", "FAILED"), cluster, job,
             out, TRAIN_TIMEOUT_S)  # fmt: skip
    total = time.monotonic() - started
    fields, second = cluster.job(job), text()[len(first) :]  # --open-mode=append
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, second)
    assert f"slurm: job {job} (verl-gsm8k-multi) restart 1 on n" in second, second[-6000:]
    assert "1 node(s) x 1 GPU(s)" in second, second[-6000:]
    assert "resume: global_step_1 is whole" in second and "Training from scratch" not in second
    for role in ("actor", "critic"):
        line = f"reshard: global_step_1/{role} was saved at world size 2: rewritten for 1 "
        assert line in second, second[-6000:]
        assert (saved / role / "model_world_size_2_rank_1.pt").is_file()  # the original, kept
    segments = metric_segments(run_dir)
    assert [sorted(s for s in seg if "actor/pg_loss" in seg[s]) for seg in segments] == [[1], [2]]
    last = json.loads((run_dir / "global_step_2" / "actor" / "fsdp_config.json").read_text())
    assert last["world_size"] == 1 and (run_dir / TRACKER).read_text().strip() == "2"
    assert slurm_ray_groups(job) == set()
    print(
        f"\nthe requeue's first start ended {ended:.0f} s after its SIGTERM (KillWait "
        f"{KILL_WAIT_S} s); the job ended at {total:.0f} s, two starts"
    )
