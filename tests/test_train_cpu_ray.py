"""Many machines, at small scale: a two-node Ray cluster on this one machine (a head and a second
node started with `ray start`, one logical GPU each), and the smoke recipe with NNODES=2 attached
to it through the documented entry point (RAY_ADDRESS), one PPO step, checkpoint written by both
ranks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port
from test_train_cpu import ONE_SMALL_STEP, cpu_env, launch, output

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RAY = Path(sys.executable).parent / "ray"


def ray_cmd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(RAY), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_smoke_on_a_two_node_ray_cluster(tmp_path: Path):
    env = cpu_env(
        tmp_path / "home", tmp_path / "runs", NNODES="2", NDEVICES_PER_NODE="1", **ONE_SMALL_STEP
    )
    # The nodes know nothing of the recipe: only Ray's own settings (no idle-worker prestart).
    node_env = dict(env, RAY_enable_worker_prestart="0", RAY_prestart_worker_first_driver="0")
    address = f"127.0.0.1:{free_port()}"
    common = [
        "--num-cpus=8",
        "--num-gpus=1",
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
    ]
    try:
        head = ray_cmd(
            node_env, "start", "--head", f"--port={address.split(':')[1]}",
            "--include-dashboard=false", *common,
        )  # fmt: skip
        assert head.returncode == 0, head.stdout + head.stderr
        second = ray_cmd(node_env, "start", f"--address={address}", *common)
        assert second.returncode == 0, second.stdout + second.stderr
        for _ in range(60):  # the second node shows in `ray status` a few seconds after it starts
            status = ray_cmd(node_env, "status", f"--address={address}")
            if status.stdout.count(" node_") >= 2 and "/2.0 GPU" in status.stdout:
                break
            time.sleep(2)
        assert status.stdout.count(" node_") >= 2 and "/2.0 GPU" in status.stdout, status.stdout

        run = launch("smoke_tiny", dict(env, RAY_ADDRESS=address), "data.val_max_samples=8")
        assert run.result.returncode == 0, output(run)[-6000:]
        assert "Started a local Ray instance" not in output(run)  # it attached to the cluster
        run_dir = tmp_path / "runs" / "smoke_tiny"
        # the trainer ran in a worker of `ray start`: the metrics path reached it anyway
        (metrics,) = (run_dir / "metrics").glob("metrics-*.jsonl")
        steps = {json.loads(line)["step"] for line in metrics.read_text().splitlines()}
        assert steps == {0, 1}, steps
        step = run_dir / "global_step_1"
        for role in ("actor", "critic"):  # FSDP over the two nodes: one shard per rank
            for rank in (0, 1):
                assert (step / role / f"model_world_size_2_rank_{rank}.pt").is_file(), (role, rank)
    finally:
        ray_cmd(node_env, "stop", "--force")
