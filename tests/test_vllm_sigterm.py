"""vLLM's processes of a launch live through a SIGTERM from outside it and still end on their
parent's (verl_plugins/vllm_sigterm.py): real signals to a child started as vLLM starts its
engine."""

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


def test_outside_sigterm_is_ignored_the_parents_reaches_the_handler(tmp_path: Path):
    """Outside a launch (no launch id) the handler runs as before; in one, a SIGTERM from
    outside (Slurm, `kill`) is ignored and one from the parent (vLLM's own shutdown) handled."""
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(p.value == "verl_gsm8k.verl_plugins.vllm_sigterm:install" for p in plugins)
    for launch in (None, "20260101T000000Z-1-test"):
        handled, ready = tmp_path / f"handled-{launch}", tmp_path / f"ready-{launch}"
        child = multiprocessing.get_context("spawn").Process(
            target=engine, args=(str(handled), str(ready), launch), name="EngineCore")  # fmt: skip
        child.start()
        try:
            assert wait_for(ready), "the stand-in engine did not start"
            subprocess.run(["kill", "-TERM", str(child.pid)], check=True)  # from outside
            if launch:
                child.join(2.0)
                assert child.is_alive() and not handled.exists()
                os.kill(child.pid, signal.SIGTERM)  # from its parent
            assert wait_for(handled), f"no handler run ({launch})"
            child.join(20.0)
            assert child.exitcode == 0
        finally:
            child.kill()
