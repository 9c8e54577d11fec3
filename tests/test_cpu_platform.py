"""The verl plugin modules for CPU training and the flash-attention fallback, against real verl,
torch, transformers and vLLM (each in a fresh interpreter, loaded the way verl loads them).

Each patch has a test here that fails when the patch is removed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import plant_flash_attn, with_pythonpath

CPU_PLATFORM = "verl_gsm8k.verl_plugins.cpu_platform"
ATTENTION_FALLBACK = "verl_gsm8k.verl_plugins.attention_fallback"


def run_python(code: str, modules: str, cpu: bool = True, extra_path: str = "") -> str:
    """Run code in a new interpreter where `import verl` loads the named plugin modules."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "RANK", "WORLD"))}
    env["VERL_USE_EXTERNAL_MODULES"] = modules
    if extra_path:
        env = with_pythonpath(env, Path(extra_path))
    if cpu:
        env["VERL_PLATFORM"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def test_verl_selects_the_cpu_platform_through_its_registry():
    out = run_python(
        """
        import torch, verl
        from verl.utils import device
        from verl.plugin.platform import get_platform
        p = get_platform()
        print(device.get_device_name(), device.get_nccl_backend(), device.get_resource_name(),
              device.get_visible_devices_keyword(), p.is_ipc_supported())
        # verl passes current_device() to .to(): it must be a device a CPU-only torch accepts
        print(torch.ones(2).to(device.get_device_id()).device)
        mod = device.get_torch_device()
        free, total = mod.mem_get_info()
        assert 0 < free <= total and mod.max_memory_allocated() > 0
        print(mod.is_available())
        """,
        CPU_PLATFORM,
    )
    assert out.split("\n")[:3] == ["cpu gloo GPU CUDA_VISIBLE_DEVICES False", "cpu", "False"]


def test_gloo_process_group_through_verl(tmp_path):
    """verl/utils/distributed.py asks torch for backend 'cpu:gloo,cpu:gloo' on this platform.
    MASTER_PORT=0 here and below: one rank's store listens where the kernel puts it (a port
    picked free beforehand can be taken by another test's process before it is bound)."""
    out = run_python(
        """
        import os
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0")
        import torch, verl
        from verl.utils.distributed import initialize_global_process_group_ray
        initialize_global_process_group_ray()
        t = torch.ones(3)
        torch.distributed.all_reduce(t)
        print(torch.distributed.get_backend(), t.tolist())
        """,
        CPU_PLATFORM,
    )
    assert "[1.0, 1.0, 1.0]" in out


def test_fsdp2_reference_offload_with_pinned_memory():
    """verl gives the frozen reference FSDP2's CPUOffloadPolicy(pin_memory=True)."""
    out = run_python(
        """
        import os
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        import torch, verl
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        model = torch.nn.Linear(4, 2)
        fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=True))
        print(model(torch.ones(1, 4)).shape)
        """,
        CPU_PLATFORM,
    )
    assert "torch.Size([1, 2])" in out


def test_vllm_keeps_linear_weights_for_verl_weight_sync():
    """vLLM's CPU build drops a linear layer's weight after packing it; verl's weight sync loads
    into that weight through its weight_loader, so it must survive (and vLLM is imported only by
    processes that ask for it)."""
    out = run_python(
        """
        import sys, torch, verl
        assert "vllm" not in sys.modules, "the plugin must not import vLLM itself"
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.utils import set_weight_attrs
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.randn(64, 32, dtype=torch.bfloat16),
                                          requires_grad=False)
        set_weight_attrs(layer.weight, {"weight_loader": lambda p, w: p.data.copy_(w)})
        UnquantizedLinearMethod().process_weights_after_loading(layer)
        new = torch.randn(64, 32, dtype=torch.bfloat16)
        layer.weight.weight_loader(layer.weight, new)          # what verl's sync does
        UnquantizedLinearMethod().process_weights_after_loading(layer)
        x = torch.randn(3, 32, dtype=torch.bfloat16)
        out = UnquantizedLinearMethod().apply(layer, x)
        print(tuple(layer.weight.shape), torch.allclose(out, x @ new.t(), atol=0.1))
        """,
        CPU_PLATFORM,
    )
    assert out.strip().endswith("(64, 32) True")


def test_patches_stay_off_without_the_cpu_platform():
    out = run_python(
        """
        import torch, torch.distributed, verl
        print(hasattr(torch.distributed.init_process_group, "_verl_cpu_patched"),
              hasattr(torch.Tensor.pin_memory, "_verl_cpu"))
        """,
        CPU_PLATFORM,
        cpu=False,
    )
    assert out.strip() == "False False"


CRITIC_LOAD = """
    import torch, verl
    from transformers import AutoConfig
    from verl.utils.model import load_valuehead_model
    config = AutoConfig.from_pretrained("{model}")
    config.num_labels = 1
    model = load_valuehead_model("{model}", torch.float32, config, False)
    print(type(model).__name__, model.config._attn_implementation)
"""


def test_critic_loads_with_sdpa_without_flash_attn(tiny_model_dir):
    """verl's load_valuehead_model hard-codes flash_attention_2 (reported upstream:
    https://github.com/verl-project/verl/issues/5210)."""
    assert importlib.util.find_spec("flash_attn") is None
    out = run_python(CRITIC_LOAD.format(model=tiny_model_dir), ATTENTION_FALLBACK, cpu=False)
    assert out.strip().endswith("Qwen2ForTokenClassification sdpa")


def test_fallback_is_off_where_flash_attn_works(tmp_path: Path):
    plant_flash_attn(tmp_path / "site", works=True)  # its CUDA extension loads
    out = run_python(
        """
        import verl_gsm8k.verl_plugins.attention_fallback as f
        from transformers import PreTrainedModel
        print(f.install(), hasattr(PreTrainedModel._check_and_adjust_attn_implementation,
                                   "_verl_sdpa_fallback"))
        """,
        "",
        cpu=False,
        extra_path=str(tmp_path / "site"),
    )
    assert out.strip() == "False False"
