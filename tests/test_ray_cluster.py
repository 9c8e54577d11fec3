"""The preflight counts a Ray cluster's GPUs through Ray (ray.nodes()), not nvidia-smi."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import ROOT, refusing_port

from verl_gsm8k.preflight import cli as preflight
from verl_gsm8k.preflight import device
from verl_gsm8k.preflight.compose import compose


def composed(nnodes: int, per_node: int):
    overrides = [f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={per_node}"]
    return compose(ROOT / "configs", "gsm8k_ppo", overrides)


def gpu_lines(cfg, monkeypatch, address: str) -> preflight.Report:
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: a CPU-only head
    report = preflight.Report()
    preflight.check_gpus(cfg, None, report)
    return report


def test_a_cluster_that_does_not_answer_is_said_in_seconds(monkeypatch):
    monkeypatch.setattr(device, "RAY_QUERY_TIMEOUT_S", 3)
    with refusing_port() as port:  # nothing listens: ray.init waits for it
        report = gpu_lines(composed(1, 1), monkeypatch, f"127.0.0.1:{port}")
    (line,) = report.lines
    assert "[warn] gpu: the Ray cluster at RAY_ADDRESS=" in line
    assert "did not answer (no answer within 3 s): its GPUs are not checked" in line


@pytest.fixture
def ray_head(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_enable_worker_prestart="0", RAY_USAGE_STATS_ENABLED="0", HOME=str(tmp_path))
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit
    code = (
        "import sys, ray\n"
        "ray.init(address='local', num_cpus=1, num_gpus=2, include_dashboard=False, "
        f"_temp_dir={temp!r})\n"
        "print(ray.get_runtime_context().gcs_address, flush=True)\n"
        "sys.stdin.readline()\n"
        "ray.shutdown()\n"
    )
    head = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        address = head.stdout.readline().strip()
        assert address, "the Ray head did not start"
        yield address
    finally:
        head.communicate(input="\n", timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow  # a Ray head starts in 10-20 s on 2 cores
def test_the_cluster_gpus_are_counted_through_ray(ray_head, monkeypatch):
    nodes, why = device.ray_cluster_gpus(ray_head)
    assert nodes is not None, why
    assert [node["gpus"] for node in nodes] == [2.0]
    report = gpu_lines(composed(1, 2), monkeypatch, ray_head)
    assert report.lines == [
        f"preflight: [ok] gpu: Ray cluster at {ray_head}: 1 node(s), 2 GPU(s); this run uses "
        "1 node(s) x 2 GPU(s)"
    ]
    report = gpu_lines(composed(2, 2), monkeypatch, ray_head)
    assert report.errors == 1
    assert "trainer.nnodes=2 x trainer.n_gpus_per_node=2 needs 2 node(s) with 2 GPU(s) each, " \
        "the cluster has 1" in report.lines[0]  # fmt: skip


def test_cluster_shapes_verl_cannot_place_and_no_ray_without_ray_address(monkeypatch):
    """verl packs each node's workers onto one node: 2 nodes x 4 GPUs cannot use 1 node of 8."""
    nodes = [{"ip": "10.0.0.1", "gpus": 8.0, "kind": ["H100"]}, {"ip": "10.0.0.2", "gpus": 0.0,
             "kind": []}]  # fmt: skip
    monkeypatch.setattr(device, "ray_cluster_gpus", lambda address: (nodes, ""))
    report = gpu_lines(composed(2, 4), monkeypatch, "ray://head:10001")
    assert report.errors == 1 and "needs 2 node(s) with 4 GPU(s) each, the cluster has 1" in (
        report.lines[0])  # fmt: skip
    assert "Ray cluster at ray://head:10001: 2 node(s), 8 GPU(s) (H100)" in report.lines[0]
    report = gpu_lines(composed(1, 8), monkeypatch, "ray://head:10001")
    assert report.errors == 0 and "this run uses 1 node(s) x 8 GPU(s)" in report.lines[0]
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(device, "ray_cluster_gpus", lambda address: pytest.fail("asked Ray"))
    report = preflight.Report()
    preflight.check_gpus(composed(1, 1), None, report)
    assert report.lines == [
        "preflight: [note] gpu: no NVIDIA GPU visible here: GPU count not checked"
    ]
