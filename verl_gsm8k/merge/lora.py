"""Fold the LoRA adapter of a merged verl checkpoint into its weights: W' = W + B·A·alpha/r.

verl 0.9.1's model merger, given a LoRA actor's checkpoint, writes the BASE weights unmerged as the
model and puts the adapter aside in `<target>/lora_adapter/` (adapter_config.json +
adapter_model.safetensors; verl/model_merger/base_model_merger.py ~321-423). Handed out as
"merged", that model is the untrained base. verl_gsm8k/merge/checkpoint.py calls fold_adapter() on
the merger's output, before verifying it, so that a merged model always carries its adapter.

verl reads lora_alpha from lora_train_meta.json in the checkpoint and writes 0 when that file is
missing (the adapter would then be a no-op); alpha 0 is refused here unless it is given.
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_gsm8k.common import json_read

ADAPTER_DIR = "lora_adapter"


class LoraError(Exception):
    """A LoRA adapter that cannot be folded in; the message is one line."""


def adapter_config(model_dir: Path) -> dict | None:
    path = model_dir / ADAPTER_DIR / "adapter_config.json"
    if not path.is_file():
        return None
    try:
        return json_read.read(path, max_bytes=1 << 20)
    except (OSError, json_read.JsonError) as exc:
        raise LoraError(f"{path}: unreadable adapter config ({exc})") from None


def fold_adapter(model_dir: Path, role: str, lora_alpha: float | None = None) -> dict | None:
    """Merge <model_dir>/lora_adapter into the model saved in model_dir, in place.

    Returns what the manifest records (rank, alpha, target modules, tensors changed), or None when
    there is no adapter. lora_alpha overrides the adapter config's value."""
    config = adapter_config(model_dir)
    if config is None:
        return None
    rank = int(config.get("r") or 0)
    alpha = float(lora_alpha if lora_alpha is not None else config.get("lora_alpha") or 0)
    if rank <= 0:
        raise LoraError(f"{model_dir / ADAPTER_DIR}: adapter rank {rank} is not positive")
    if alpha <= 0:
        raise LoraError(
            f"{model_dir / ADAPTER_DIR}: LoRA alpha is {alpha:g} (the checkpoint has no "
            "lora_train_meta.json): merging would hand out the untrained base; give the alpha the "
            "run used with --lora-alpha"
        )
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if role == "critic" else AutoModelForCausalLM
    base = auto.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
    before = {name: p.detach().clone() for name, p in base.named_parameters()}
    config["lora_alpha"] = alpha
    (model_dir / ADAPTER_DIR / "adapter_config.json").write_text(json.dumps(config, indent=2))
    merged = PeftModel.from_pretrained(base, model_dir / ADAPTER_DIR).merge_and_unload()
    # 0 only for an adapter that never trained (LoRA's B starts at zero)
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, before[n])]
    for stale in model_dir.glob("model*.safetensors*"):
        stale.unlink()
    merged.save_pretrained(model_dir, safe_serialization=True)
    return {
        "merged": True,
        "rank": rank,
        "alpha": alpha,
        "scale": alpha / rank,
        "target_modules": sorted(config.get("target_modules") or []),
        "tensors_changed": len(changed),
        "adapter_kept_in": ADAPTER_DIR,
    }
