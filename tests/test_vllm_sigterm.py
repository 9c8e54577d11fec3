"""vLLM's processes of a launch live through a SIGTERM from outside it, and still end on their
parent's (verl_gsm8k/verl_plugins/vllm_sigterm.py). Real signals to a real child process started
as vLLM starts its engine (multiprocessing, the plugin called in its main thread, then a SIGTERM
handler of its own installed, as vllm/v1/engine/core.py does). The plugin inside a real launch,
vLLM's engine living through a SIGTERM to every process: tests/test_slurm_nodes_cpu.py's requeue."""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

from verl_gsm8k.common.launch_env import ENV_LAUNCH


def engine(handled: str, ready: str, launch: str | None) -> None:
    """A stand-in for vLLM's EngineCore: plugins first, then its own handler, then a loop."""
    if launch:
        os.environ[ENV_LAUNCH] = launch
    from verl_gsm8k.verl_plugins.vllm_sigterm import install

    install()
    signal.signal(signal.SIGTERM, lambda *_: Path(handled).touch())
    Path(ready).touch()
    while not Path(handled).exists():
        time.sleep(0.05)


def wait_for(path: Path, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not path.exists():
        time.sleep(0.05)
    return path.exists()


def start(tmp_path: Path, launch: str | None) -> tuple[multiprocessing.Process, Path]:
    handled, ready = tmp_path / "handled", tmp_path / "ready"
    child = multiprocessing.get_context("spawn").Process(
        target=engine, args=(str(handled), str(ready), launch), name="EngineCore"
    )
    child.start()
    assert wait_for(ready), "the stand-in engine did not start"
    return child, handled


def test_the_plugin_is_vllms_general_plugin():
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(p.value == "verl_gsm8k.verl_plugins.vllm_sigterm:install" for p in plugins)


def test_outside_sigterm_is_ignored_the_parents_reaches_the_handler(tmp_path: Path):
    child, handled = start(tmp_path, launch="20260101T000000Z-1-test")
    try:
        # from outside the launch (Slurm, `kill`): the process lives on, its handler never runs
        subprocess.run(["kill", "-TERM", str(child.pid)], check=True)
        child.join(2.0)
        assert child.is_alive() and not handled.exists()
        # from its parent (vLLM's own shutdown of its engine): its handler runs
        os.kill(child.pid, signal.SIGTERM)
        assert wait_for(handled), "the parent's SIGTERM did not reach the process's handler"
        child.join(20.0)
        assert child.exitcode == 0
    finally:
        child.kill()


def test_outside_a_launch_nothing_changes(tmp_path: Path):
    child, handled = start(tmp_path, launch=None)
    try:
        subprocess.run(["kill", "-TERM", str(child.pid)], check=True)
        assert wait_for(handled), "without a launch id the handler runs as before"
    finally:
        child.kill()
