"""A LoRA adapter folded in by peft's merge_and_unload: verl's merger writes it aside
(base_model_merger.py ~321-423). Its alpha is lora_train_meta.json's; none: refused."""

import json
from pathlib import Path

from verl_gsm8k.common import json_read

ADAPTER_DIR = "lora_adapter"


class LoraError(Exception):
    """A LoRA adapter that cannot be folded in; the message is one line."""


def fold_adapter(model_dir: Path, role: str, lora_alpha: float | None = None) -> dict | None:
    """<model_dir>/lora_adapter merged into the model saved in ``model_dir``, in place; what the
    manifest records, or None without an adapter. ``lora_alpha`` overrides the adapter's."""
    path = model_dir / ADAPTER_DIR / "adapter_config.json"
    if not path.is_file():
        return None
    try:
        config = json_read.read(path, max_bytes=1 << 20)
        rank = int(config.get("r") or 0)
        alpha = float(lora_alpha if lora_alpha is not None else config.get("lora_alpha") or 0)
    except (OSError, json_read.JsonError, AttributeError, TypeError, ValueError) as err:
        raise LoraError(f"{path}: unreadable adapter config ({err})") from None
    if rank <= 0 or alpha <= 0:
        raise LoraError(f"{path.parent}: LoRA rank {rank}, alpha {alpha:g} (without "
                        "lora_train_meta.json verl writes alpha 0): merging would hand out "
                        "the untrained base; give the alpha the run used with --lora-alpha"
                        )  # fmt: skip
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if role == "critic" else AutoModelForCausalLM
    base = auto.from_pretrained(model_dir, dtype=torch.bfloat16)
    before = {name: p.detach().clone() for name, p in base.named_parameters()}
    path.write_text(json.dumps({**config, "lora_alpha": alpha}, indent=2))
    merged = PeftModel.from_pretrained(base, path.parent).merge_and_unload()
    # 0 only for an adapter that never trained (LoRA's B starts at zero)
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, before[n])]
    for stale in model_dir.glob("model*.safetensors*"):
        stale.unlink()
    merged.save_pretrained(model_dir, safe_serialization=True)
    return {"merged": True, "rank": rank, "alpha": alpha, "scale": alpha / rank,
            "target_modules": sorted(config.get("target_modules") or []),
            "tensors_changed": len(changed), "adapter_kept_in": ADAPTER_DIR}  # fmt: skip
