"""The CPU smoke run inside `slurm/one_node.sbatch` on a real Slurm (munged, slurmctld, slurmd
started here from a one-node slurm.conf: tests/slurm_local.py), stopped by its time limit, then
by a requeue that signals every process of the job, and resumed after each.

1. The time limit. The job's trainer is held right before step 2's rollout (common/pause.py), and
   its time limit is then cut to the sbatch's signal lead (`--signal=B:TERM@120`) from now:
   Slurm's own timer sends SIGTERM to the batch shell, as it does before every time limit (and as
   `scancel --signal=TERM --batch` does: the same signal to the same shell). The launcher (exec'd
   by the sbatch file) has the trainer save the step in flight, exits 5 and requeues its job.
2. A preemption. The limit is put back; the requeued start (same job, same command, same run
   directory, its output appended) resumes and is held before step 3's rollout; `scontrol requeue`
   then has Slurm send SIGTERM to every process of the job (then SIGKILL after KillWait), as a
   preemption with PreemptMode=REQUEUE does: vLLM's engine and worker ignore it (one line each,
   verl_plugins/vllm_sigterm.py), the rollout runs, the step in flight is saved, exit 5, and the
   launcher says Slurm requeued the job rather than requeueing it again. wandb (offline) logs
   beside the file logger: its service ends on the signal, the metrics file still has the step,
   and the next start sends that step to its own wandb run.
3. The third start resumes from step 3 and ends the run. Every step is logged once, the last
   checkpoint merges. The job's time limit is known: the launch says its deadline. One verl
   launch per job start: three in all (docs/testing.md, "Added since").

The suite's one proof of a SIGTERM to the launcher alone (the stop request saves the step in
flight, stamped by this launch, exit 5, the relaunch resumes from it) and of a SIGTERM to every
process of a launch (tests/test_train_cpu.py's kill test: a SIGKILL, damage, the watchdog).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import ROOT, merge_run
from slurm_local import Cluster, require_slurm, slurm_cluster
from test_train_cpu import cpu_env, metric_segments
from wandb_offline import history

from verl_gsm8k.common.run_dir import read_stamp
from verl_gsm8k.launch.reap import launch_processes, of_run_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

JOB_TIMEOUT_S = 900
LEAD_S = 120  # slurm/one_node.sbatch: --signal=B:TERM@120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require_slurm()
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def wait_for(what: str, ready, cluster: Cluster, job: str, out: Path, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if ready():
            return time.monotonic() - start
        time.sleep(0.5)
    cluster.run("scancel", job)
    text = out.read_text(errors="replace") if out.exists() else ""
    raise AssertionError(f"no {what} after {timeout} s: {cluster.job(job)}\n{text[-6000:]}")


def seconds(runtime: str) -> int:
    """scontrol's RunTime, [D-]HH:MM:SS, in seconds."""
    days, _, clock = runtime.rpartition("-")
    hours, minutes, secs = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + secs


def test_a_job_stopped_by_its_time_limit_then_requeued_by_slurm_resumes_each_time_and_ends(
    cluster: Cluster, tmp_path: Path
):
    runs = tmp_path / "runs"
    run_dir = runs / "smoke_tiny"
    out = tmp_path / "job.out"
    held = tmp_path / "paused-before-rollout"
    env = cpu_env(tmp_path / "home", runs, TOTAL_TRAINING_STEPS="4", SAVE_FREQ="100",
                  TEST_FREQ="100", GSM8K_PAUSE_AT="rollout:2,rollout:3",
                  LOGGER="console,file,wandb", WANDB_MODE="offline",
                  GSM8K_PAUSE_FILE=str(held), **cluster.env)  # fmt: skip
    submit = [
        "sbatch", "--parsable", "--gpus-per-node=0", f"--cpus-per-task={cluster.cpus}",
        "--time=30", f"--output={out}", str(ROOT / "slurm" / "one_node.sbatch"),
        "recipes/smoke_tiny.sh", "trainer.val_before_train=False",
    ]  # fmt: skip
    started = time.monotonic()
    submitted = cluster.run(*submit, env=env, cwd=ROOT)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    said = "recipe: SIGTERM: the trainer saves the step in flight"

    def limit(value: str) -> None:
        done = cluster.run("scontrol", "update", f"JobId={job}", f"TimeLimit={value}")
        assert done.returncode == 0, done.stdout + done.stderr

    def signalled(times: int) -> bool:
        return out.read_text(errors="replace").count(said) >= times

    # 1. step 1 trained, the trainer held before step 2's rollout: the time limit cut to end
    #    the signal lead from now (Slurm keeps limits in whole minutes: up to a minute more), so
    #    the signal is due at once or within that minute, and the job keeps at least LEAD_S - 5 s
    #    for the step and its save; Slurm's timer signals the batch shell (the launcher)
    wait_for("step 2's rollout held", held.exists, cluster, job, out, JOB_TIMEOUT_S)
    ran = seconds(cluster.job(job)["RunTime"])
    cut = ran + LEAD_S
    limit(f"{cut // 60}:{cut % 60:02d}")
    cut_at = time.monotonic()
    wait_for("Slurm's time-limit signal", lambda: signalled(1), cluster, job, out, 300)
    waited = time.monotonic() - cut_at
    limit("30")  # the requeued starts get the whole limit again
    held.unlink()  # step 2 goes on

    # 2. the job requeues itself; its second start resumes and is held before step 3's rollout:
    #    `scontrol requeue` (what a preemption with PreemptMode=REQUEUE does): Slurm sends SIGTERM
    #    to every process of the job, SIGKILL after KillWait (tests/slurm_local.py)
    def second_held() -> bool:
        return cluster.job(job).get("Restarts") == "1" and held.exists()

    wait_for("the second start's step 3 held", second_held, cluster, job, out, JOB_TIMEOUT_S)
    requeued = cluster.run("scontrol", "requeue", job)
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    wait_for("the requeue's SIGTERM", lambda: signalled(2), cluster, job, out, 120)
    held.unlink()  # step 3 goes on

    # 3. Slurm requeued the job; its third start resumes and ends the run
    def ended() -> bool:
        state = cluster.job(job)
        return state.get("Restarts") == "2" and state.get("JobState") in ("COMPLETED", "FAILED")

    wait_for("the third start's end", ended, cluster, job, out, JOB_TIMEOUT_S)
    total = time.monotonic() - started
    state = cluster.job(job)
    text = out.read_text(errors="replace")
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", (state, text[-6000:])

    first, second, third = text.split(f"slurm: job {job} ", 3)[1:]
    assert "restart 0" in first and "restart 1" in second and "restart 2" in third
    # the launch said its deadline: the job's time limit is known
    assert "recipe: deadline: the job ends at" in first
    assert "5 s before Slurm job" in first  # the grace runs to the job's end
    # KillWait (tests/slurm_local.py: 120 s) against a stop measured by the earlier start
    kill_wait = f"recipe: Slurm: a requeue or preemption of job {job} leaves 120 s from its SIGTERM"
    assert f"{kill_wait} to its SIGKILL (KillWait" in first and "no step measured" in first
    assert "measured here, it fits" in second, second[-6000:]
    # each stop saved the step in flight, stamped by its own launch (SAVE_FREQ=100: the stop
    # request's save), and the launcher exited 5
    segments = metric_segments(run_dir)
    assert len(segments) == 3
    stamps = [m.name[len("metrics-") : -len(".jsonl")]
              for m in sorted((run_dir / "metrics").glob("metrics-*.jsonl"))]  # fmt: skip
    for n, (part, step) in enumerate(((first, 2), (second, 3))):
        assert f"stopped on SIGTERM after saving step {step} " in part, part[-6000:]
        assert read_stamp(run_dir, step) == stamps[n]
    # the time limit: the job requeued itself; the preemption: Slurm did, and the launcher says so
    # instead of a second requeue that would fail
    assert f"recipe: requeueing Slurm job {job} (restart 0): it resumes from step 2" in first
    assert f"recipe: Slurm requeued job {job} itself (restart 2: " in second, second[-6000:]
    # the requeue's SIGKILL comes KillWait after its SIGTERM, not at the time limit: said so
    assert f"5 s before Slurm's SIGKILL, KillWait 120 s after its requeue of job {job}" in second
    assert "failed: resubmit" not in second and "requeueing Slurm job" not in second
    assert "resume: global_step_2 is whole" in second, second[-6000:]
    # vLLM's engine lived through the SIGTERM to every process (without the plugin it ends and
    # the rollout fails), and whatever outlived verl was stopped by the launcher, not by Slurm
    assert "SIGTERM to vLLM's EngineCore" in second and "outside the launch: ignored" in second
    assert "could not be stopped" not in first + second + third
    assert "resume: global_step_3 is whole" in third, third[-6000:]
    assert "Training from scratch" not in second + third
    # wandb (offline): its service ended on the requeue's SIGTERM and lost step 3; the third
    # start sent it to its own wandb run before step 4 (ppo_trainer/wandb_gap.py)
    assert "wandb: its service process ended" in second and "step 3 is in the" in second
    assert "wandb: 1 step(s) of earlier launches, 3 to 3, are in" in third, third[-6000:]
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 3, runs
    (first_run,), (third_run,) = runs[0].glob("run-*.wandb"), runs[2].glob("run-*.wandb")
    assert sorted(history(first_run)) == [1, 2]  # stopped by a SIGTERM to the launcher alone
    assert sorted(history(third_run)) == [3, 4]

    # 4. every step logged once across the three starts; the last checkpoint whole and merged
    trained = [s for seg in segments for s, m in seg.items() if "actor/pg_loss" in m]
    assert sorted(trained) == [1, 2, 3, 4], trained
    assert [max(s for s in seg if "actor/pg_loss" in seg[s]) for seg in segments] == [2, 3, 4]
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["step_s"] > 0 and timings["save_s"] > 0 and timings["start_s"] > 0
    assert [p.pid for p in launch_processes(of_run_dir(str(run_dir)))] == []  # none left
    merge_run(run_dir, tmp_path / "merged", env)
    print(
        f"\nthe time limit cut at {ran} s of the job; Slurm's SIGTERM {waited:.0f} s later; run "
        f"ended at {total:.0f} s (three job starts); measured: {timings}"
    )
