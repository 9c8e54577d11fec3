"""The CPU platform and flash-attention fallback plugins against real verl, each patch
asserted in a fresh interpreter that loads them as verl does."""

import importlib.util
import os
import sys
import textwrap
from pathlib import Path

from helpers import capture, plant_flash_attn, with_pythonpath


def run_python(code: str, modules: str, cpu: bool = True, path: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "RANK", "WORLD"))}
    env |= {"VERL_USE_EXTERNAL_MODULES": modules} | ({"VERL_PLATFORM": "cpu"} if cpu else {})
    env = with_pythonpath(env, path) if path else env
    result = capture([sys.executable, "-c", textwrap.dedent(code)], 0, 300, env=env)
    return "\n".join(line[2:] for line in result.stdout.splitlines() if line.startswith("@ "))


def test_verl_trains_on_the_cpu_platform():
    out = run_python("""
        import os, sys
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
        import torch, verl
        from verl.plugin.platform import get_platform
        from verl.utils import device
        assert "vllm" not in sys.modules, "the plugin must not import vLLM itself"
        print("@", device.get_device_name(), device.get_nccl_backend(), device.get_resource_name(),
              device.get_visible_devices_keyword(), get_platform().is_ipc_supported())
        print("@", torch.ones(2).to(device.get_device_id()).device)  # verl passes it to .to()
        mod = device.get_torch_device()
        free, total = mod.mem_get_info()
        assert 0 < free <= total and mod.max_memory_allocated() > 0 and not mod.is_available()
        from verl.utils.distributed import initialize_global_process_group_ray
        initialize_global_process_group_ray()
        t = torch.ones(3)
        torch.distributed.all_reduce(t)
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        model = torch.nn.Linear(4, 2)
        fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=True))
        print("@", t.tolist(), tuple(model(torch.ones(1, 4)).shape))
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.utils import set_weight_attrs
        layer, method = torch.nn.Module(), UnquantizedLinearMethod()
        layer.weight = torch.nn.Parameter(torch.randn(64, 32, dtype=torch.bfloat16),
                                          requires_grad=False)
        set_weight_attrs(layer.weight, {"weight_loader": lambda p, w: p.data.copy_(w)})
        method.process_weights_after_loading(layer)
        new = torch.randn(64, 32, dtype=torch.bfloat16)
        layer.weight.weight_loader(layer.weight, new)  # what verl's sync does
        method.process_weights_after_loading(layer)
        x = torch.randn(3, 32, dtype=torch.bfloat16)
        print("@", torch.allclose(method.apply(layer, x), x @ new.t(), atol=0.1))
    """, "verl_gsm8k.verl_plugins.cpu_platform")  # fmt: skip
    assert out.splitlines() == ["cpu gloo GPU CUDA_VISIBLE_DEVICES False", "cpu",
                                     "[1.0, 1.0, 1.0] (1, 2)", "True"]  # fmt: skip


def test_without_flash_attn_the_critic_loads_with_sdpa_and_the_patches_stay_off(
    tiny_model_dir,
):
    assert importlib.util.find_spec("flash_attn") is None
    out = run_python(f"""
        import torch, torch.distributed, verl
        from transformers import AutoConfig
        from verl.utils.model import load_valuehead_model
        print("@", hasattr(torch.distributed.init_process_group, "_verl_cpu"),
              hasattr(torch.Tensor.pin_memory, "_verl_cpu"))
        config = AutoConfig.from_pretrained("{tiny_model_dir}")
        config.num_labels = 1
        model = load_valuehead_model("{tiny_model_dir}", torch.float32, config, False)
        print("@", type(model).__name__, model.config._attn_implementation)
    """, "verl_gsm8k.verl_plugins.cpu_platform,verl_gsm8k.verl_plugins.attention_fallback",
        cpu=False)  # fmt: skip
    assert out.splitlines() == ["False False", "Qwen2ForTokenClassification sdpa"]


def test_the_fallback_is_off_where_flash_attn_2_works(tmp_path):
    out = run_python("""
        import verl_gsm8k.verl_plugins.attention_fallback as f
        from transformers import PreTrainedModel
        print("@", f.install(), hasattr(PreTrainedModel._check_and_adjust_attn_implementation,
                                   "_verl_sdpa_fallback"))
    """, "", cpu=False, path=plant_flash_attn(tmp_path, works=True))  # fmt: skip
    assert out.strip() == "False False"
