"""A "cpu" platform for verl (VERL_PLATFORM=cpu, plugin/platform/platform_manager.py; the patches
act only then): device cpu, backend gloo, Ray resource GPU (verl's pools count GPU/NPU only), no
IPC, current_device() "cpu" (an int fails in .to(): fsdp_utils.py ~507), a torch.cuda stand-in."""

import contextlib
import functools
import os
import resource
import types
from typing import Any

import psutil
import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

from verl_gsm8k.verl_plugins.after_import import after_import


def _rss(*_: Any) -> int:
    return psutil.Process().memory_info().rss


def _mem_get_info(*_: Any) -> tuple[int, int]:  # (free, total), as torch.cuda's
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _peak_rss(*_: Any) -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _none(*_: Any, **__: Any) -> None:
    return None


# torch.cuda's stand-in. is_available() is False: verl then skips CUDA-only memory tuning and
# maps checkpoints to the CPU (verl/protocol.py ~416, verl/utils/memory_utils.py).
DEVICE_MODULE = types.ModuleType("verl_cpu_device")
vars(DEVICE_MODULE).update(
    is_available=lambda: False, device_count=lambda: 1, current_device=lambda: "cpu",
    get_device_name=lambda *_: "cpu", mem_get_info=_mem_get_info, memory_allocated=_rss,
    memory_reserved=_rss, max_memory_allocated=_peak_rss, max_memory_reserved=_peak_rss,
    manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
    get_rng_state=lambda *_: torch.get_rng_state(),
    set_rng_state=lambda state, *_: torch.set_rng_state(state), Stream=torch.cpu.Stream,
    Event=torch.cpu.Event, stream=torch.cpu.stream, current_stream=torch.cpu.current_stream,
    **dict.fromkeys(("set_device", "synchronize", "empty_cache", "ipc_collect",
                     "set_per_process_memory_fraction", "reset_peak_memory_stats",
                     "reset_accumulated_memory_stats"), _none),
)  # fmt: skip


def _answer(value: Any) -> Any:
    return lambda self, *_, **__: value


# verl's platform interface (verl/plugin/platform/platform_base.py), answered by the host
ANSWERS = {
    "device_name": property(_answer("cpu")), "vendor_name": property(_answer("cpu")),
    "device_module": property(_answer(DEVICE_MODULE)), "is_available": _answer(True),
    "is_platform_available": lambda self, *_, **__: cpu_platform_selected(),
    "current_device": _answer("cpu"), "device_count": _answer(1),
    "manual_seed": lambda self, seed: torch.manual_seed(seed),
    "manual_seed_all": lambda self, seed: torch.manual_seed(seed),
    "get_device_capability": _answer((None, None)), "communication_backend_name": _answer("gloo"),
    "visible_devices_envvar": _answer("CUDA_VISIBLE_DEVICES"), "ray_resource_name": _answer("GPU"),
    "ray_noset_envvars": lambda self: ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"],
    "is_ipc_supported": _answer(False), "nvtx_range": lambda self, msg: contextlib.nullcontext(),
    **dict.fromkeys(("set_device", "synchronize", "set_allocator_settings", "empty_cache",
                     "profiler_start", "profiler_stop", "cudart"), _answer(None)),
}  # fmt: skip
PlatformCPU = PlatformRegistry.register(platform="cpu")(
    type("PlatformCPU", (PlatformBase,), ANSWERS)
)


def cpu_platform_selected() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"


def _patched(owner: Any, name: str, make: Any) -> None:
    """``owner.name`` replaced by ``make(original)``, once."""
    original = getattr(owner, name)
    if not getattr(original, "_verl_cpu", False):
        replacement = make(original)
        replacement._verl_cpu = True
        setattr(owner, name, replacement)


def _dedupe_gloo_backend(original: Any) -> Any:
    """verl/utils/distributed.py ~63 and ~89 ask for backend f"cpu:gloo,{device}:{backend}",
    here "cpu:gloo,cpu:gloo", which torch refuses ("Duplicate device type cpu")."""

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") == "cpu:gloo,cpu:gloo":
            kwargs["backend"] = "cpu:gloo"
        return original(*args, **kwargs)

    return init_process_group


def _pinning_is_identity(_original: Any) -> Any:
    """verl/workers/engine/fsdp/transformer_impl.py ~462 gives the reference
    CPUOffloadPolicy(pin_memory=True); pin_memory() raises without an accelerator."""
    return lambda self, *_, **__: self


def _keep_vllm_linear_weights(linear: types.ModuleType) -> None:
    """vLLM's CPU build drops each linear weight once packed for oneDNN (layers/linear.py ~220);
    verl's weight sync loads into it (vllm_rollout/utils.py ~405): kept, and re-packed."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    _patched(linear.UnquantizedLinearMethod, "process_weights_after_loading", lambda _: (
        lambda self, layer: dispatch_cpu_unquantized_gemm(layer, remove_weight=False)))  # fmt: skip


if cpu_platform_selected():
    _patched(torch.distributed, "init_process_group", _dedupe_gloo_backend)
    if not torch.accelerator.is_available():
        _patched(torch.Tensor, "pin_memory", _pinning_is_identity)
    after_import("vllm.model_executor.layers.linear", _keep_vllm_linear_weights)
