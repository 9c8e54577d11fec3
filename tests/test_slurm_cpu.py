"""The CPU smoke run inside `slurm/one_node.sbatch` on a real Slurm (munged, slurmctld, slurmd
started here from a one-node slurm.conf: tests/slurm_local.py), stopped by its time limit.

The job's trainer is held right before step 2's rollout (common/pause.py), and its time limit is
then cut to two minutes past the sbatch's signal lead (`--signal=B:TERM@120`): Slurm's own timer
sends SIGTERM to the batch shell, as it does before every time limit (and as a preemption's
`scancel --signal=TERM --batch` does: the same signal to the same shell). The launcher (exec'd by
the sbatch file) has the trainer save the step in flight, exits 5 and requeues its job; the limit
is put back, and the requeued job (same job, same command, same run directory, its output
appended) resumes from that step and ends the run. Every step is logged once, the last checkpoint
merges. The job's time limit is known: the launch says its deadline. One verl launch per job
start: two in all (docs/testing.md, "Added since").

The suite's one proof of a SIGTERM to the launcher: the stop request saves the step in flight
(stamped by this launch), exit 5, the relaunch resumes from it (tests/test_train_cpu.py's SIGKILL
test had its own SIGTERM launch until 2026-11-26).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import ROOT, merge_run, require_path
from slurm_local import Cluster, binary, missing_binary, slurm_cluster
from test_train_cpu import cpu_env, metric_segments

from verl_gsm8k.guard.files import read_stamp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

JOB_TIMEOUT_S = 900
LEAD_S = 120  # slurm/one_node.sbatch: --signal=B:TERM@120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    missing = missing_binary()
    require_path(
        Path(binary(missing) or f"/usr/bin/{missing}") if missing else Path("/"),
        f"no {missing} (Debian's slurm-wlm and munge: apt-get install slurm-wlm munge)",
    )
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


def test_a_job_at_its_time_limit_saves_requeues_resumes_and_ends(cluster: Cluster, tmp_path: Path):
    runs = tmp_path / "runs"
    run_dir = runs / "smoke_tiny"
    out = tmp_path / "job.out"
    held = tmp_path / "paused-before-rollout-2"
    env = cpu_env(tmp_path / "home", runs, TOTAL_TRAINING_STEPS="3", SAVE_FREQ="100",
                  TEST_FREQ="100", GSM8K_PAUSE_AT="rollout:2", GSM8K_PAUSE_FILE=str(held),
                  **cluster.env)  # fmt: skip
    submit = [
        "sbatch", "--parsable", "--gpus-per-node=0", f"--cpus-per-task={cluster.cpus}",
        "--time=30", f"--output={out}", str(ROOT / "slurm" / "one_node.sbatch"),
        "recipes/smoke_tiny.sh", "trainer.val_before_train=False",
    ]  # fmt: skip
    started = time.monotonic()
    submitted = cluster.run(*submit, env=env, cwd=ROOT)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    def limit(value: str) -> None:
        done = cluster.run("scontrol", "update", f"JobId={job}", f"TimeLimit={value}")
        assert done.returncode == 0, done.stdout + done.stderr

    # 1. step 1 trained, the trainer held before step 2's rollout: the time limit cut to end
    #    two minutes past the signal lead; Slurm's timer signals the batch shell (the launcher)
    wait_for("step 2's rollout held", held.exists, cluster, job, out, JOB_TIMEOUT_S)
    ran = seconds(cluster.job(job)["RunTime"])
    cut = ran + LEAD_S + 120
    limit(f"{cut // 60}:{cut % 60:02d}")
    cut_at = time.monotonic()
    said = "recipe: SIGTERM: the trainer saves the step in flight"
    wait_for("Slurm's time-limit signal", lambda: said in out.read_text(errors="replace"),
             cluster, job, out, 300)  # fmt: skip
    waited = time.monotonic() - cut_at
    at = time.monotonic() - started
    limit("30")  # the requeued start gets the whole limit again
    held.unlink()  # step 2 goes on

    # 2. the job requeues itself and its second start ends the run
    def ended() -> bool:
        state = cluster.job(job)
        return state.get("Restarts") == "1" and state.get("JobState") in ("COMPLETED", "FAILED")

    wait_for("the requeued job's end", ended, cluster, job, out, JOB_TIMEOUT_S)
    total = time.monotonic() - started
    state = cluster.job(job)
    text = out.read_text(errors="replace")
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", (state, text[-6000:])

    first, second = text.split(f"slurm: job {job} ", 2)[1:]
    assert "restart 0" in first and "restart 1" in second
    # the launch said its deadline: the job's time limit is known
    assert "recipe: deadline: the job ends at" in first
    assert "5 s before Slurm job" in first  # the grace runs to the job's end
    saved = int(first.split("stopped on SIGTERM after saving step ")[1].split()[0])
    assert saved == 2  # the step in flight when the signal came
    # the step saved is the first launch's own (its launch stamp; SAVE_FREQ=100: the stop
    # request's save), and the launcher exited 5 (the requeue below follows exit 5 alone). The
    # claim of tests/test_train_cpu.py's SIGTERM launch until 2026-11-26 (docs/testing.md)
    first_metrics = sorted((run_dir / "metrics").glob("metrics-*.jsonl"))[0]
    assert read_stamp(run_dir, saved) == first_metrics.name[len("metrics-") : -len(".jsonl")]
    assert f"recipe: requeueing Slurm job {job} (restart 0): it resumes from step {saved}" in first
    assert f"resume: global_step_{saved} is whole" in second, second[-6000:]
    assert "Training from scratch" not in second

    # 3. every step logged once across the two starts; the last checkpoint whole and merged
    segments = metric_segments(run_dir)
    assert len(segments) == 2
    trained = [s for seg in segments for s, m in seg.items() if "actor/pg_loss" in m]
    assert sorted(trained) == [1, 2, 3], trained
    assert max(s for s in segments[0] if "actor/pg_loss" in segments[0][s]) == saved
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["step_s"] > 0 and timings["save_s"] > 0 and timings["start_s"] > 0
    merge_run(run_dir, tmp_path / "merged", env)
    print(
        f"\nthe time limit cut at {ran} s of the job; Slurm's SIGTERM {waited:.0f} s later, at "
        f"{at:.0f} s (step {saved} in flight); run ended at {total:.0f} s (two job starts); "
        f"measured: {timings}"
    )
