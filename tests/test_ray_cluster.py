"""The preflight counts a Ray cluster's GPUs through Ray (ray.nodes()), not nvidia-smi; on a real
two-node Ray cluster: tests/test_slurm_nodes_cpu.py ("Ray cluster at ...: 2 node(s), 2 GPU(s)")."""

from __future__ import annotations

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
