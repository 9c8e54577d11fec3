"""The CPU smoke run inside `slurm/one_node.sbatch` on a real Slurm (munged, slurmctld, slurmd
started here from a one-node slurm.conf: tests/slurm_local.py), preempted mid-run.

`scancel --signal=TERM --batch` once a step is logged, as a preemption's signal or the time
limit's `--signal=B:TERM@N` reaches the batch shell: the launcher (exec'd by the sbatch file) has
the trainer save the step in flight, exits 5 and requeues its job; the requeued job (same job, same
command, same run directory, its output appended) resumes from that step and ends the run. Every
step is logged once, the last checkpoint merges. The job's time limit is known: the launch says
its deadline. One verl launch per job start: two in all (docs/testing.md, "Added since").

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
from killing import logged_steps, newest_metrics
from slurm_local import Cluster, binary, missing_binary, slurm_cluster
from test_train_cpu import cpu_env, metric_segments

from verl_gsm8k.guard.files import read_stamp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

JOB_TIMEOUT_S = 900


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


def test_a_preempted_sbatch_job_saves_requeues_resumes_and_ends(cluster: Cluster, tmp_path: Path):
    runs = tmp_path / "runs"
    run_dir = runs / "smoke_tiny"
    out = tmp_path / "job.out"
    env = cpu_env(tmp_path / "home", runs, TOTAL_TRAINING_STEPS="3", SAVE_FREQ="100",
                  TEST_FREQ="100", **cluster.env)  # fmt: skip
    submit = [
        "sbatch", "--parsable", "--gpus-per-node=0", f"--cpus-per-task={cluster.cpus}",
        "--time=30", f"--output={out}", str(ROOT / "slurm" / "one_node.sbatch"),
        "recipes/smoke_tiny.sh", "trainer.val_before_train=False",
    ]  # fmt: skip
    started = time.monotonic()
    submitted = cluster.run(*submit, env=env, cwd=ROOT)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    def first_steps() -> set[int]:
        path = newest_metrics(run_dir, set()) if (run_dir / "metrics").is_dir() else None
        return logged_steps(path) if path else set()

    # 1. a step logged: the batch shell (the launcher) gets SIGTERM, as on a preemption
    wait_for("step 1 logged", lambda: 1 in first_steps(), cluster, job, out, JOB_TIMEOUT_S)
    signalled = cluster.run("scancel", "--signal=TERM", "--batch", job)
    assert signalled.returncode == 0, signalled.stderr
    at = time.monotonic() - started

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
    assert saved >= 1
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
        f"\nSIGTERM at {at:.0f} s (step {saved} in flight), run ended at {total:.0f} s "
        f"(two job starts); measured: {timings}"
    )
