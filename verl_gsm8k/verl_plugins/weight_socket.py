"""Two verl runs on one host never share the socket that carries new weights to vLLM.

verl names it ``/tmp/rl-colocate-zmq-{job}-replica-{r}-rank-{k}.sock`` by the Ray job id
(workers/rollout/vllm_rollout/vllm_rollout.py:141; vllm_async_server.py:143 exports it, utils.py:425
reads it), which every cluster starts at ``01000000``: two clusters on one host unlink each other's
socket and a weight sync hangs. Both sides append a hash of the Ray session's name.
"""

import functools
import hashlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from verl_gsm8k.verl_plugins.after_import import after_import

VLLM_ROLLOUT = "verl.workers.rollout.vllm_rollout"


def cluster_job_id(job_id: str) -> str:
    """``job_id`` and 8 hex digits of this process's Ray session name."""
    import ray

    session = ray.get_runtime_context().get_session_name()
    return f"{job_id}-{hashlib.sha256(session.encode()).hexdigest()[:8]}"


def _after_init(cls: type, then: Callable[[Any], None]) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        then(self)

    cls.__init__ = __init__  # type: ignore[misc]


def _trainer_side(module: ModuleType) -> None:
    def rename(adapter: Any) -> None:
        job = adapter.zmq_handle.removeprefix("ipc:///tmp/rl-colocate-zmq-").split("-")[0]
        adapter.zmq_handle = adapter.zmq_handle.replace(f"-{job}-", f"-{cluster_job_id(job)}-", 1)

    _after_init(module.ServerAdapter, rename)


def _vllm_side(module: ModuleType) -> None:
    def export(_server: Any) -> None:  # before the server starts vLLM's processes
        os.environ["VERL_RAY_JOB_ID"] = cluster_job_id(os.environ["VERL_RAY_JOB_ID"])

    _after_init(module.vLLMHttpServer, export)


after_import(f"{VLLM_ROLLOUT}.vllm_rollout", _trainer_side)
after_import(f"{VLLM_ROLLOUT}.vllm_async_server", _vllm_side)
