"""A benchmark SIGKILLed while its launch runs (an out-of-memory killer, a scheduler past its
grace) takes the launch with it: the launch runs in a session of its own (so that the benchmark
can stop its whole group), and Linux's parent-death signal, SIGTERM (the launcher's stop), reaches
it when the benchmark dies (verl_gsm8k/common/children.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow


def _launcher(bench: subprocess.Popen, timeout: float) -> psutil.Process:
    """The benchmark's launch, once it is the launcher (bash exec'd it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(bench.pid).children():
            try:
                if "verl_gsm8k.launch" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    bench.kill()
    pytest.fail(f"no launcher under the benchmark after {timeout} s: {bench.communicate()[0]}")


def test_a_sigkilled_learning_benchmark_takes_its_launch_with_it(tmp_path: Path):
    """The learning benchmark writes its launch's output to a file (not a pipe whose reader dies
    with it), so nothing but the parent-death signal ends the launch: without it the launch goes
    on building its warm start, then trains for minutes (bench/cpu_train.py and bench/preflight.py
    start theirs the same way)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))  # --fresh-cache's directory
    bench = subprocess.Popen(
        [sys.executable, "-m", "verl_gsm8k.bench.learning", "--seeds", "0", "--algos", "ppo",
         "--fresh-cache", "--out", str(tmp_path / "out")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    launcher = _launcher(bench, 60)
    try:
        bench.kill()
        bench.communicate(timeout=30)
        gone, _ = psutil.wait_procs([launcher], timeout=30)
        assert gone, f"the launch {launcher.pid} outlived its SIGKILLed benchmark"
    finally:
        if launcher.is_running():  # all of it: the launch and what it started
            for process in [*launcher.children(recursive=True), launcher]:
                process.kill()
