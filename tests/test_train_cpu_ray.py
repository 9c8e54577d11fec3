"""Many machines, at small scale: a two-node Ray cluster on this one machine (a head and a second
node started with `ray start --block`, one logical GPU each), the smoke recipe submitted to it as
a Ray job (`ray job submit`, as docs/scaling.md submits it; NNODES=2), then stopped with
`ray job stop` while its trainer is held right before step 1's rollout; the cluster gone, the
same recipe relaunched on this one node (world size 1) resumes that two-rank checkpoint and ends
the run.

Storage is laid out as on a real cluster: the second node runs in a mount namespace of its own
(`unshare --mount`) with a private tmpfs over `local/`, its node-local disk, which the head
cannot see; `shared/` (the run directory, the cache with model and data) is what both mount.
Every FSDP rank writes its checkpoint shard on its own node, so the run only keeps its
checkpoint when RUN_DIR is shared: the test asserts that every rank's shards landed there, that
they are read in one place (the one-node resume below rewrites them for one rank from all of
them), and that a file the second node writes on its local disk does not reach the head (so a
run dir there would lose that node's shards).

`ray job stop` sends SIGTERM to the entrypoint and every process under it (the launcher, verl's
driver; the trainer and workers run in the cluster's own workers), then SIGKILL after
RAY_JOB_STOP_WAIT_TIME_S (3 s unless the head was started with it: 480 here): the step in flight
is saved by the stop request, the launcher exits 5, the job ends STOPPED. Right before it, every
process of the second node gets SIGTERM too, as every process of every node of a Slurm job does
on a requeue or preemption: that node's Ray was started as slurm/multi_node.sbatch starts it
(SIGTERM blocked, ``python -m verl_gsm8k.launch.reap exec``), the launch's variables reach its
workers (the launcher passes them in Ray's runtime_env), so its FSDP rank and its vLLM engine
live through the signal and the step is saved (without them vLLM's engine ended and nothing was
saved: measured under a real two-node Slurm, docs/slurm.md).

A run that lost a node: verl 0.9.1 resumes only the shards of its own world size, so the
relaunch's launcher rewrites step 1's for one rank before verl starts (verl_gsm8k/reshard/; what
the resharded shards hold, bit for bit, and the next steps' losses: tests/test_reshard.py), and
verl trains step 2 from them: every step logged once across the two launches.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from test_train_cpu import ONE_SMALL_STEP, TRAIN_TIMEOUT_S, cpu_env, launch, metric_segments, output

from verl_gsm8k.common.run_dir import TRACKER
from verl_gsm8k.evaluate.server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RAY = Path(sys.executable).parent / "ray"
NODE_ARGS = ["--num-cpus=8", "--num-gpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
JOB = "smoke-two-nodes"
ARGS = ("trainer.val_before_train=False", "data.val_max_samples=8")


def ray_cmd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(RAY), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def private_mounts_work() -> bool:
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def wait_for(what: str, ready, timeout: float, logs) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():
            return
        time.sleep(1)
    raise AssertionError(f"no {what} after {timeout} s:\n{logs()[-6000:]}")


def test_a_ray_job_on_two_nodes_is_stopped_saved_and_resumed_on_one(tmp_path: Path):
    if not private_mounts_work():  # the node-local disk of the second node needs it
        message = "unshare --mount is not permitted here (needs CAP_SYS_ADMIN)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    shared, local = tmp_path / "shared", tmp_path / "local"
    local.mkdir()
    held = shared / "paused-before-rollout-1"
    knobs = dict(ONE_SMALL_STEP, TOTAL_TRAINING_STEPS="2", SAVE_FREQ="100", TEST_FREQ="100")
    env = cpu_env(shared / "home", shared / "runs", NNODES="2", NDEVICES_PER_NODE="1", **knobs)
    # What a job's entrypoint sees is the head's environment (Ray's job supervisor runs in one
    # of its workers): the recipe's knobs, Ray's stop wait, and the test's hold of the trainer.
    # STOP_GRACE_S over the wait: the launch must say that `ray job stop` would cut it short.
    node_env = dict(env, RAY_enable_worker_prestart="0", RAY_prestart_worker_first_driver="0",
                    RAY_JOB_STOP_WAIT_TIME_S="480", STOP_GRACE_S="720",
                    GSM8K_PAUSE_AT="rollout:1", GSM8K_PAUSE_FILE=str(held))  # fmt: skip
    head, port, dashboard = start_head(node_env)
    address, jobs = f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}"
    # the second node: its own mount namespace, a tmpfs over local/, a marker written there
    second_cmd = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f'mount -t tmpfs none "{local}" && echo node2 > "{local}/written-by-node-2" && '
        f'exec "{sys.executable}" -m verl_gsm8k.launch.reap exec -- "{RAY}" start '
        f'--address={address} --block {" ".join(NODE_ARGS)}',
    ]  # fmt: skip
    nodes = [head]

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(jobs)  # Ray's job API: its CLI words a status differently each

    def logs() -> str:
        return client.get_job_logs(JOB)

    def status() -> JobStatus:
        return client.get_job_status(JOB)

    try:
        nodes.append(subprocess.Popen(second_cmd, env=node_env, stdout=subprocess.DEVNULL))
        for _ in range(60):  # the second node shows in `ray status` a few seconds after it starts
            state = ray_cmd(node_env, "status", f"--address={address}")
            if state.stdout.count(" node_") >= 2 and "/2.0 GPU" in state.stdout:
                break
            time.sleep(2)
        assert state.stdout.count(" node_") >= 2 and "/2.0 GPU" in state.stdout, state.stdout
        assert not (local / "written-by-node-2").exists()  # node-local: the head cannot see it

        entrypoint = (f"cd {shlex.quote(str(ROOT))} && exec bash recipes/smoke_tiny.sh "
                      f"{' '.join(ARGS)}")  # fmt: skip
        for _ in range(30):  # the job agent starts after the node shows in `ray status`
            submitted = ray_cmd(node_env, "job", "submit", f"--address={jobs}", "--no-wait",
                                f"--submission-id={JOB}", "--", "bash", "-c",
                                entrypoint)  # fmt: skip
            said = submitted.stdout + submitted.stderr
            if submitted.returncode == 0 or "No available agent" not in said:
                break
            time.sleep(2)  # Ray's own answer: "No available agent ..., please try again later"
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        wait_for("step 1's rollout held", held.exists, TRAIN_TIMEOUT_S, logs)
        second = in_session(nodes[1].pid)  # reap exec: the node's own session
        assert len(second) >= 5, second  # its `ray start`, raylet, agents, the job's workers
        for pid in second:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        stopping = ray_cmd(node_env, "job", "stop", f"--address={jobs}", "--no-wait", JOB)
        assert stopping.returncode == 0, stopping.stdout + stopping.stderr
        wait_for("the launcher's stop request", lambda: "recipe: SIGTERM:" in logs(), 120, logs)
        held.unlink()  # step 1 goes on
        wait_for("the job's end", lambda: status().is_terminal(), 600, logs)  # 480 s: the SIGKILL
        said = logs()
        assert status() == JobStatus.STOPPED, (status(), said[-6000:])
        # the second node lived through its SIGTERM: its vLLM engine said so, its Ray still runs
        assert "SIGTERM to vLLM's EngineCore" in said and "outside the launch: ignored" in said
        assert nodes[1].poll() is None
        assert "Started a local Ray instance" not in said  # it attached to the cluster
        # Ray's job supervisor gives the entrypoint the cluster's address by the node's own IP
        assert "preflight: [ok] gpu: Ray cluster at " in said and ": 2 node(s), 2 GPU(s)" in said
        # a two-node run in /tmp: the launcher says that /tmp is usually node-local
        assert "recipe: warning: NNODES=2 and RUN_DIR" in said
        # the entrypoint sees the head's environment: Ray's stop wait, said against the grace
        assert ("recipe: warning: a Ray job: `ray job stop` sends SIGKILL "
                "RAY_JOB_STOP_WAIT_TIME_S=480 s after its SIGTERM") in said  # fmt: skip
        run_dir = shared / "runs" / "smoke_tiny"
        # the step in flight, saved by the stop request alone (SAVE_FREQ=100), exit 5
        saved = run_dir / "global_step_1"
        assert f"recipe: stopped on SIGTERM after saving step 1 ({saved})" in said
        assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
        # the trainer ran in a worker of `ray start`: the metrics path reached it anyway
        (metrics,) = (run_dir / "metrics").glob("metrics-*.jsonl")
        steps = {json.loads(line)["step"] for line in metrics.read_text().splitlines()}
        assert steps == {1}, steps
        for role in ("actor", "critic"):  # FSDP over the two nodes: every rank's files, here
            for kind in ("model", "optim", "extra_state"):
                for rank in (0, 1):
                    shard = saved / role / f"{kind}_world_size_2_rank_{rank}.pt"
                    assert shard.is_file(), shard
    finally:
        if held.exists():
            held.unlink()
        ray_cmd(node_env, "job", "stop", f"--address={jobs}", JOB)
        if len(nodes) > 1:  # SIGTERM blocked there: SIGKILL to the node's session
            for pid in in_session(nodes[1].pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            nodes[1].wait(timeout=60)
        stop_node(head)
        forget_the_head(port)

    # the cluster is gone: the same recipe on this node alone, one rank, resumes and ends
    again = launch("smoke_tiny", cpu_env(shared / "home", shared / "runs", **knobs), *ARGS)
    said = output(again)
    assert again.result.returncode == 0, said[-6000:]
    assert "resume: global_step_1 is whole" in said and "Training from scratch" not in said
    for role in ("actor", "critic"):
        line = f"reshard: global_step_1/{role} was saved at world size 2: rewritten for 1 "
        assert line in said, said[-6000:]
        assert (saved / role / "model_world_size_2_rank_1.pt").is_file()  # the original, kept
    segments = metric_segments(run_dir)
    assert [sorted(s for s in seg if "actor/pg_loss" in seg[s]) for seg in segments] == [[1], [2]]
    last = json.loads((run_dir / "global_step_2" / "actor" / "fsdp_config.json").read_text())
    assert last["world_size"] == 1 and (run_dir / TRACKER).read_text().strip() == "2"


def start_head(env: dict[str, str]) -> tuple[subprocess.Popen, int, int]:
    """`ray start --head --block` on ports picked free, with its job server (the dashboard),
    answering `ray status` and `ray job list`: (the process, Ray's port, the dashboard's). A port
    picked free is not reserved: another test's process can take it before the head listens, and
    the head then exits, so a few ports are tried."""
    for _ in range(3):
        port, dashboard = free_port(), free_port()
        cmd = [str(RAY), "start", "--head", f"--port={port}", "--include-dashboard=true",
               "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--block",
               *NODE_ARGS]  # fmt: skip
        head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        jobs = f"--address=http://127.0.0.1:{dashboard}"
        for _ in range(90):
            if (ray_cmd(env, "status", f"--address=127.0.0.1:{port}").returncode == 0
                    and ray_cmd(env, "job", "list", jobs).returncode == 0):  # fmt: skip
                return head, port, dashboard
            if head.poll() is not None:
                break
            time.sleep(2)
        stop_node(head)
        forget_the_head(port)
    pytest.fail("`ray start --head` and its job server did not come up on any of 3 ports")


def in_session(sid: int) -> list[int]:
    """The live processes of session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
    return found


def stop_node(node: subprocess.Popen) -> None:
    node.terminate()  # `ray start --block` stops its processes on SIGTERM
    try:
        node.wait(timeout=120)
    except subprocess.TimeoutExpired:
        node.kill()


def forget_the_head(port: int) -> None:
    """`ray start --head` names its cluster in Ray's address file (/tmp/ray/ray_current_cluster),
    and a later `ray.init()` with no address connects to whatever that file names (it stops the
    next test's local run with "When connecting to an existing cluster, num_cpus and num_gpus must
    not be provided"). `ray stop` would clear it, and stop every Ray process of the machine; this
    clears only the file, and only when it still names this test's head."""
    from ray._common.utils import get_ray_address_file

    address_file = Path(get_ray_address_file(None))
    try:
        if address_file.read_text().strip().endswith(f":{port}"):
            address_file.unlink()
    except OSError:
        pass
