"""A "cpu" platform for verl 0.9.1, so its real PPO loop trains on a machine without an accelerator.

verl loads this module in every process that imports verl (the trainer, each Ray worker) when it
is named in VERL_USE_EXTERNAL_MODULES (as verl_gsm8k.verl_plugins.cpu_platform) and importable
there: the project is installed (editable) in the environment every Ray worker runs in.
VERL_PLATFORM=cpu then selects the platform below through verl's own registry
(verl/plugin/platform/platform_manager.py). Nothing here runs unless both are set, and the
patches act only when the cpu platform is the selected one.

What the platform answers, and why:
  device "cpu", backend "gloo"   every tensor and collective stays on the host;
  Ray resource "GPU"             verl's resource pool only counts GPU/NPU: Ray is started with
                                 logical GPUs (ray_kwargs.ray_init.num_gpus), one per worker;
  CUDA_VISIBLE_DEVICES           what vLLM and verl read to pair workers with "devices";
  no IPC                         verl then syncs weights to vLLM through shared memory + ZMQ;
  current_device() == "cpu"      verl passes it to .to(); an int fails without an accelerator
                                 (verl/utils/fsdp_utils.py ~507).

Three places have no extension point and are patched at import (see each function):
  _dedupe_gloo_backend           verl/utils/distributed.py ~63/89 builds "cpu:gloo,cpu:gloo";
  _pinning_is_identity           verl/workers/engine/fsdp/transformer_impl.py ~462 gives the
                                 reference CPUOffloadPolicy(pin_memory=True);
  _keep_vllm_linear_weights      vLLM's CPU build drops each linear layer's weight after packing
                                 it, and verl's weight sync loads into exactly those weights.
The flash-attention fallback is a module of its own (attention_fallback.py): a GPU machine
without flash-attn needs it too.
"""

from __future__ import annotations

import functools
import os
import resource
import types
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

from verl_gsm8k.verl_plugins.after_import import after_import

PLATFORM = "cpu"


def _rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; 0 where unreadable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _mem_get_info(*_args: Any) -> tuple[int, int]:
    """(free, total) host memory in bytes, like torch.cuda.mem_get_info."""
    info: dict[str, int] = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    return info.get("MemAvailable", 0), info.get("MemTotal", 0)


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _device_module() -> types.ModuleType:
    """A stand-in for torch.cuda: host memory figures, torch's CPU RNG, streams and events.

    is_available() is False on purpose: verl then skips CUDA-only memory tuning and maps
    checkpoints to the CPU (verl/protocol.py ~416, verl/utils/memory_utils.py).
    """
    mod = types.ModuleType("verl_cpu_device")
    cpu = torch.cpu
    mod.is_available = lambda: False
    mod.device_count = lambda: 1
    mod.current_device = lambda: PLATFORM
    mod.set_device = _noop
    mod.synchronize = _noop
    mod.empty_cache = _noop
    mod.ipc_collect = _noop
    mod.set_per_process_memory_fraction = _noop
    mod.reset_peak_memory_stats = _noop
    mod.reset_accumulated_memory_stats = _noop
    mod.get_device_name = lambda *_: "cpu"
    mod.mem_get_info = _mem_get_info
    mod.memory_allocated = lambda *_: _rss_bytes()
    mod.memory_reserved = lambda *_: _rss_bytes()
    mod.max_memory_allocated = lambda *_: _peak_rss_bytes()
    mod.max_memory_reserved = lambda *_: _peak_rss_bytes()
    mod.manual_seed = torch.manual_seed
    mod.manual_seed_all = torch.manual_seed
    mod.get_rng_state = lambda *_: torch.get_rng_state()
    mod.set_rng_state = lambda state, *_: torch.set_rng_state(state)
    mod.Stream = cpu.Stream
    mod.Event = cpu.Event
    mod.stream = cpu.stream
    mod.current_stream = cpu.current_stream
    return mod


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface answered by the host CPU (toy-scale training and debugging)."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return PLATFORM

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return cpu_platform_selected()

    def current_device(self) -> str:  # type: ignore[override]  # verl passes it to .to()
        return PLATFORM

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def cpu_platform_selected() -> bool:
    """True when VERL_PLATFORM selects this platform (the only case the patches below act in)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


def _dedupe_gloo_backend() -> None:
    """verl/utils/distributed.py ~63 and ~89 pass backend f"cpu:gloo,{device}:{backend}" to
    torch.distributed.init_process_group; with device "cpu" that is "cpu:gloo,cpu:gloo", which
    torch rejects ("Duplicate device type cpu in backend string"). Collapse the duplicate."""
    original = torch.distributed.init_process_group
    if getattr(original, "_verl_cpu_patched", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any):
        if kwargs.get("backend") == "cpu:gloo,cpu:gloo":
            kwargs["backend"] = "cpu:gloo"
        return original(*args, **kwargs)

    init_process_group._verl_cpu_patched = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


def _pinning_is_identity() -> None:
    """verl/workers/engine/fsdp/transformer_impl.py ~462 offloads the frozen reference with
    FSDP2's CPUOffloadPolicy(pin_memory=True); Tensor.pin_memory() raises without an
    accelerator. With no accelerator, host memory is all there is: pinning returns the tensor."""
    if torch.accelerator.is_available() or getattr(torch.Tensor.pin_memory, "_verl_cpu", False):
        return

    def pin_memory(self: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return self

    pin_memory._verl_cpu = True  # type: ignore[attr-defined]
    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign]


VLLM_LINEAR = "vllm.model_executor.layers.linear"


def _keep_vllm_linear_weights(linear: types.ModuleType) -> None:
    """vLLM's CPU build packs each linear weight for oneDNN after loading and replaces the
    parameter with an empty one (vllm/model_executor/layers/linear.py ~220,
    UnquantizedLinearMethod.process_weights_after_loading -> dispatch_cpu_unquantized_gemm(...,
    remove_weight=True)). verl syncs the trained weights into vLLM after every step with
    model.load_weights (verl/workers/rollout/vllm_rollout/utils.py ~405), which needs those
    parameters and their weight_loader: "'Parameter' object has no attribute 'weight_loader'".
    Keep the weights (tiny models: the extra copy is small); verl re-runs
    process_weights_after_loading after each sync, which re-packs the updated weights."""
    method = linear.UnquantizedLinearMethod
    if getattr(method.process_weights_after_loading, "_verl_cpu", False):
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    process_weights_after_loading._verl_cpu = True  # type: ignore[attr-defined]
    method.process_weights_after_loading = process_weights_after_loading


def apply_patches() -> None:
    if cpu_platform_selected():
        _dedupe_gloo_backend()
        _pinning_is_identity()
        after_import(VLLM_LINEAR, _keep_vllm_linear_weights)


apply_patches()
