"""Many machines, at small scale: a two-node Ray cluster on this one machine (a head and a second
node started with `ray start --block`, one logical GPU each), and the smoke recipe with NNODES=2
attached to it through the documented entry point (RAY_ADDRESS), one PPO step.

Storage is laid out as on a real cluster: the second node runs in a mount namespace of its own
(`unshare --mount`) with a private tmpfs over `local/`, its node-local disk, which the head
cannot see; `shared/` (the run directory, the cache with model and data) is what both mount.
Every FSDP rank writes its checkpoint shard on its own node, so the run only keeps its
checkpoint when RUN_DIR is shared: the test asserts that every rank's shards landed there, that
merge.sh reads them in one place, and that a file the second node writes on its local disk does
not reach the head (so a run dir there would lose that node's shards)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import merge_run
from test_train_cpu import ONE_SMALL_STEP, cpu_env, launch, output

from verl_gsm8k.evaluate.server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RAY = Path(sys.executable).parent / "ray"
NODE_ARGS = ["--num-cpus=8", "--num-gpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]


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


def test_smoke_on_a_two_node_ray_cluster(tmp_path: Path):
    if not private_mounts_work():  # the node-local disk of the second node needs it
        message = "unshare --mount is not permitted here (needs CAP_SYS_ADMIN)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    shared, local = tmp_path / "shared", tmp_path / "local"
    local.mkdir()
    env = cpu_env(
        shared / "home", shared / "runs", NNODES="2", NDEVICES_PER_NODE="1", **ONE_SMALL_STEP
    )
    # The nodes know nothing of the recipe: only Ray's own settings (no idle-worker prestart).
    node_env = dict(env, RAY_enable_worker_prestart="0", RAY_prestart_worker_first_driver="0")
    head, port = start_head(node_env)
    address = f"127.0.0.1:{port}"
    # the second node: its own mount namespace, a tmpfs over local/, a marker written there
    second_cmd = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f'mount -t tmpfs none "{local}" && echo node2 > "{local}/written-by-node-2" && '
        f'exec "{RAY}" start --address={address} --block {" ".join(NODE_ARGS)}',
    ]  # fmt: skip
    nodes = [head]
    try:
        nodes.append(subprocess.Popen(second_cmd, env=node_env, stdout=subprocess.DEVNULL))
        for _ in range(60):  # the second node shows in `ray status` a few seconds after it starts
            status = ray_cmd(node_env, "status", f"--address={address}")
            if status.stdout.count(" node_") >= 2 and "/2.0 GPU" in status.stdout:
                break
            time.sleep(2)
        assert status.stdout.count(" node_") >= 2 and "/2.0 GPU" in status.stdout, status.stdout
        assert not (local / "written-by-node-2").exists()  # node-local: the head cannot see it

        run = launch("smoke_tiny", dict(env, RAY_ADDRESS=address), "data.val_max_samples=8")
        assert run.result.returncode == 0, output(run)[-6000:]
        assert "Started a local Ray instance" not in output(run)  # it attached to the cluster
        assert f"preflight: [ok] gpu: Ray cluster at {address}: 2 node(s), 2 GPU(s)" in output(run)
        # a two-node run in /tmp: the launcher says that /tmp is usually node-local
        assert "recipe: warning: NNODES=2 and RUN_DIR" in output(run)
        run_dir = shared / "runs" / "smoke_tiny"
        # the trainer ran in a worker of `ray start`: the metrics path reached it anyway
        (metrics,) = (run_dir / "metrics").glob("metrics-*.jsonl")
        steps = {json.loads(line)["step"] for line in metrics.read_text().splitlines()}
        assert steps == {0, 1}, steps
        step = run_dir / "global_step_1"
        for role in ("actor", "critic"):  # FSDP over the two nodes: every rank's files, here
            for kind in ("model", "optim", "extra_state"):
                for rank in (0, 1):
                    shard = step / role / f"{kind}_world_size_2_rank_{rank}.pt"
                    assert shard.is_file(), shard
        merge_run(run_dir, tmp_path / "merged", env)  # every shard read in one place
    finally:
        for node in reversed(nodes):
            stop_node(node)
        forget_the_head(port)


def start_head(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """`ray start --head --block` on a port picked free, answering `ray status`. A port picked free
    is not reserved: another test's process can take it before the head listens, and the head then
    exits, so a few ports are tried."""
    for _ in range(3):
        port = free_port()
        cmd = [str(RAY), "start", "--head", f"--port={port}", "--include-dashboard=false",
               "--block", *NODE_ARGS]  # fmt: skip
        head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        for _ in range(60):
            if ray_cmd(env, "status", f"--address=127.0.0.1:{port}").returncode == 0:
                return head, port
            if head.poll() is not None:
                break
            time.sleep(2)
        stop_node(head)
        forget_the_head(port)
    pytest.fail("`ray start --head` did not come up on any of 3 ports")


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
