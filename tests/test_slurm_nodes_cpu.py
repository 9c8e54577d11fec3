"""The CPU smoke run as a real two-node Slurm job of `slurm/multi_node.sbatch` (two slurmds on
this machine: tests/slurm_local.py), one job, two starts, one verl launch each:

1. a preemption (`scontrol requeuehold` in step 1, SIGTERM to every process): both FSDP ranks
   save the step, exit 5, Ray stopped on the nodes, the job leaves COMPLETING before KillWait;
2. a node lost: the job shrunk to one node reshards step 1 for one rank;
3. the time limit: Slurm signals the batch process, the step in flight is saved, the job requeued.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pause_points
import pytest
from helpers import ROOT
from slurm_local import Cluster, require_slurm, seconds, slurm_cluster
from test_train_cpu import ONE_SMALL_STEP, TRAIN_TIMEOUT_S, cpu_env, metric_segments
from wandb_offline import history

from verl_gsm8k.common.run_dir import TRACKER, metrics_paths, metrics_stamp, read_stamp
from verl_gsm8k.launch.reap import launch_processes, of_run_dir, slurm_ray_groups
from verl_gsm8k.resume.verify import problem

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# Ray's --num-cpus is SLURM_CPUS_ON_NODE: the CPU run's workers need more than two
NODE_CPUS = 8
ARGS = ("trainer.val_before_train=False", "data.val_max_samples=8")
KILL_WAIT_S = 120  # tests/slurm_local.py
LEAD_S = 180  # slurm/multi_node.sbatch: --signal=B:TERM@180
HELD = ("PENDING", "REQUEUE_HOLD", "REQUEUED")  # scontrol's words once COMPLETING is over
SIGTERM_SAID = "recipe: SIGTERM: the trainer saves the step in flight"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory):
    require_slurm()
    with slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2, cpus=NODE_CPUS) as running:
        yield running


def test_a_two_node_job_preempted_resumes_on_one_node_then_requeues_itself_at_its_time_limit(
    two_nodes: Cluster, tmp_path: Path
):
    cluster = two_nodes
    runs = tmp_path / "runs"
    run_dir = runs / "smoke_tiny"
    out = tmp_path / "job.out"
    held = tmp_path / "paused-before-rollout"
    # 2 of 3 steps train: step 2 is not the last, so its launcher requeues the job
    knobs = dict(ONE_SMALL_STEP, TOTAL_TRAINING_STEPS="3", SAVE_FREQ="100", TEST_FREQ="100")
    # one logical GPU a node for Ray; no worker prestart: fewer idle workers on two cores
    env = cpu_env(tmp_path / "home", runs, **knobs, GPUS_PER_NODE="1",
                  LOGGER="console,file,wandb", WANDB_MODE="offline",
                  RAY_enable_worker_prestart="0", RAY_prestart_worker_first_driver="0",
                  **cluster.env)  # fmt: skip
    env = pause_points.env("rollout:1,rollout:2", held, env)  # the job's nodes: srun passes it
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

    def wait_for(what: str, ready, timeout: float = TRAIN_TIMEOUT_S) -> float:
        return cluster.wait_for(what, ready, job, out, timeout)

    def control(*change: str) -> None:
        done = cluster.run("scontrol", *change)
        assert done.returncode == 0, done.stdout + done.stderr

    # 1. the requeue during step 1 signals every process of the job
    wait_for("step 1's rollout held", held.exists)
    control("requeuehold", job)
    signalled = time.monotonic()
    wait_for("the requeue's SIGTERM", lambda: SIGTERM_SAID in text(), 120)
    held.unlink()  # step 1 goes on

    def stopped() -> bool:  # held after the requeue, every process of the first start gone
        return "stopping Ray on the job's nodes" in text() and state() in HELD

    wait_for("the first start's end", stopped)
    ended = time.monotonic() - signalled
    first = text()
    # nothing of the job left on either node
    assert slurm_ray_groups(job) == set()
    assert [p.pid for p in launch_processes(of_run_dir(str(run_dir)))] == []
    saved = run_dir / "global_step_1"
    assert f"recipe: stopped on SIGTERM after saving step 1 ({saved})" in first, first[-6000:]
    assert f"recipe: Slurm requeued job {job} itself (restart 1: " in first, first[-6000:]
    grace = f"5 s before Slurm's SIGKILL, KillWait {KILL_WAIT_S} s after its requeue of job {job}"
    assert grace in first, first[-6000:]
    # the deadline and KillWait's margin, no stop measured yet
    assert "recipe: deadline: the job ends at" in first
    kill_wait = f"recipe: Slurm: a requeue or preemption of job {job} leaves {KILL_WAIT_S} s from"
    assert kill_wait in first and "no step measured" in first, first[-6000:]
    # Ray on both nodes; its workers and vLLM's engines lived through the SIGTERM
    assert "preflight: [ok] gpu: Ray cluster at " in first and ": 2 node(s), 2 GPU(s)" in first
    assert "SIGTERM to vLLM's EngineCore" in first and "outside the launch: ignored" in first
    for role in ("actor", "critic"):  # FSDP over the two nodes: every rank's files
        for kind in ("model", "optim", "extra_state"):
            for rank in (0, 1):
                assert (saved / role / f"{kind}_world_size_2_rank_{rank}.pt").is_file()
    # Ray stopped by the batch process: the job left COMPLETING before Slurm's SIGKILL
    assert ended < KILL_WAIT_S, (ended, first[-6000:])
    assert f"slurm: Ray of job {job} on " in first and " 0 processes stopped" not in first

    # 2. one node lost (the task count first, or Slurm starts it on two nodes again)
    control("update", f"JobId={job}", "NumTasks=1")
    control("update", f"JobId={job}", "NumNodes=1", f"NumCPUs={cluster.cpus}")
    control("release", job)
    wait_for("step 2's rollout held", lambda: cluster.job(job).get("Restarts") == "1" and
             held.exists())  # fmt: skip
    # the partition down: the job its launcher requeues stays pending
    control("update", "PartitionName=debug", "State=DOWN")

    # 3. the time limit cut to end within the signal lead: Slurm signals the batch process
    ran = seconds(cluster.job(job)["RunTime"])
    control("update", f"JobId={job}", f"TimeLimit={(ran + LEAD_S) // 60}")
    cut_at = time.monotonic()
    wait_for("Slurm's time-limit signal", lambda: text().count(SIGTERM_SAID) >= 2, 300)
    waited = time.monotonic() - cut_at
    control("update", f"JobId={job}", "TimeLimit=30")
    held.unlink()  # step 2 goes on

    def requeued() -> bool:  # the second start over, the job queued again by its own launcher
        fields, stops = cluster.job(job), text().count("stopping Ray on the job's nodes")
        return stops >= 2 and fields.get("Restarts") == "2" and fields.get("JobState") == "PENDING"

    wait_for("the launcher's requeue", requeued)
    total = time.monotonic() - started
    cluster.run("scancel", job)
    control("update", "PartitionName=debug", "State=UP")
    # the second start's output (--open-mode=append)
    second = text()[len(first) :]
    assert f"slurm: job {job} (verl-gsm8k-multi) restart 1 on n" in second, second[-6000:]
    assert "1 node(s) x 1 GPU(s)" in second, second[-6000:]
    assert "resume: global_step_1 is whole" in second and "Training from scratch" not in second
    for role in ("actor", "critic"):
        line = f"reshard: global_step_1/{role} was saved at world size 2: rewritten for 1 "
        assert line in second, second[-6000:]
        assert (saved / role / "model_world_size_2_rank_1.pt").is_file()  # the original, kept
    # the time limit: the step in flight saved (SAVE_FREQ=100), whole, stamped; the job requeued
    assert "measured here, it fits" in second, second[-6000:]
    assert "5 s before Slurm job" in second  # the grace runs to the job's end
    assert "stopped on SIGTERM after saving step 2 " in second, second[-6000:]
    stamps = [metrics_stamp(path) for path in metrics_paths(run_dir)]
    assert len(stamps) == 2 and read_stamp(run_dir, 2) == stamps[1]
    assert problem(run_dir / "global_step_2", ("actor", "critic")) is None
    assert f"recipe: requeueing Slurm job {job} (restart 1): it resumes from step 2" in second
    assert "failed: resubmit" not in second
    assert "could not be stopped" not in first + second

    # every step logged once; the last checkpoint whole at world size 1
    segments = metric_segments(run_dir)
    assert [sorted(s for s in seg if "actor/pg_loss" in seg[s]) for seg in segments] == [
        [1], [2]]  # fmt: skip
    last = json.loads((run_dir / "global_step_2" / "actor" / "fsdp_config.json").read_text())
    assert last["world_size"] == 1 and (run_dir / TRACKER).read_text().strip() == "2"
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["step_s"] > 0 and timings["save_s"] > 0 and timings["start_s"] > 0
    assert slurm_ray_groups(job) == set()
    assert [p.pid for p in launch_processes(of_run_dir(str(run_dir)))] == []
    # wandb (offline): a service the SIGTERM ended costs one line, the step is in the metrics
    runs_logged = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs_logged) == 2, runs_logged
    logged = [sorted(history(next(r.glob("run-*.wandb")))) for r in runs_logged]
    service_ended = "wandb: its service process ended" in first
    if service_ended:
        assert "step 1 is in the metrics file, not in wandb" in first, first[-6000:]
    assert 2 in logged[1], logged
    print(
        f"\nthe requeue's first start ended {ended:.0f} s after its SIGTERM (KillWait "
        f"{KILL_WAIT_S} s); the time limit cut at {ran} s of the second start, Slurm's signal "
        f"{waited:.0f} s later; the job requeued by its launcher at {total:.0f} s; wandb's service "
        f"ended on the requeue's SIGTERM: {service_ended}, steps in each start's wandb run: "
        f"{logged}; measured: {timings}"
    )
