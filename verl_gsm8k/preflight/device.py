"""The device, the attention, LoRA layouts and the GPUs a composed config gets here."""

import json
import os
import subprocess
import sys
from typing import Any

from verl_gsm8k.common import attention as atn
from verl_gsm8k.common import gpus
from verl_gsm8k.preflight.lines import Report

FALLBACK = "verl_gsm8k.verl_plugins.attention_fallback"
CPU_MODULE = "verl_gsm8k.verl_plugins.cpu_platform"
RAY_QUERY_TIMEOUT_S = 30  # ray.init + ray.nodes in a child process
_RAY_NODES = """import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps([{"gpus": n["Resources"].get("GPU", 0.0), "kind": sorted(k.split(":")[1]
    for k in n["Resources"] if k.startswith("accelerator_type:"))}
    for n in ray.nodes() if n["Alive"]]))"""


def lora_rank(model_cfg: Any) -> int:
    rank = int(model_cfg.get("lora", {}).get("rank", 0) or 0)
    return rank if rank > 0 else int(model_cfg.get("lora_rank", 0) or 0)


def attention(model_cfg: Any) -> str:
    """The attention verl asks transformers for (its default: flash-attn 2)."""
    override = model_cfg.get("override_config", None) or {}
    return str(override.get("attn_implementation", None) or "flash_attention_2")


def external_modules() -> list[str]:
    return [m.strip() for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")]


def unusable(implementation: str, choice: atn.Choice) -> str | None:
    if not implementation.startswith("flash_attention") or implementation == choice.implementation:
        return None
    if implementation == "flash_attention_2":
        return atn.flash_attn_problem()
    if implementation == "flash_attention_4":
        return atn.fa4_problem(atn.gpu_capabilities(), atn.fa4_installed())
    return f"{implementation} is not a path this project sets up"


def check_device(cfg: Any, use_critic: bool, report: Report, model: Any = None,
                 who: str = "actor") -> None:  # fmt: skip
    device, want = cfg.trainer.device, os.environ.get("ATTENTION", "auto")
    platform = os.environ.get("VERL_PLATFORM") == "cpu" and CPU_MODULE in external_modules()
    if device == "cpu" and not platform:
        report.error("device", "trainer.device=cpu needs verl's cpu platform: launch with "
                     "DEVICE=cpu")  # fmt: skip
        return
    try:
        choice = atn.probe(want, on_cpu=device == "cpu")
    except atn.AttentionRefused as refused:
        report.error("attention", str(refused))
        return
    model = cfg.actor_rollout_ref.model if model is None else model
    implementation, packed = attention(model), bool(model.use_remove_padding)
    why_not, flash2 = unusable(implementation, choice), atn.flash_attn_problem()
    if why_not is not None:  # the machine that trains may have it: a warning
        overlay = f"{choice.overlay or 'sdpa'}{'' if who == 'actor' else '_sft'}"
        report.warn("attention", f"{why_not} here but the {who} asks for {implementation}: "
                    f"add +attention={overlay} (the recipes do)")  # fmt: skip
    elif use_critic and flash2 is not None and FALLBACK not in external_modules():
        report.warn("attention", f"{flash2} here and verl loads the critic with flash_attention_2 "
                    f"(verl issue #5210): load {FALLBACK} (the recipes do)")  # fmt: skip
    else:
        why = f"set by the overrides; ATTENTION={want} chooses {choice.name} here: {choice.why}"
        chosen = (implementation, packed) == (choice.implementation, choice.padding_removal)
        said = choice.line() if chosen else atn.statement(implementation, packed, why)
        where = "the CPU (verl's cpu platform)" if device == "cpu" else device
        report.ok("device", f"trains on {where}; attention: {said}")


def check_lora(cfg: Any, use_critic: bool, report: Report) -> None:
    v1, actor = cfg.trainer.get("use_v1", True), lora_rank(cfg.actor_rollout_ref.model) > 0
    if lora_rank(cfg.critic.model) > 0 and use_critic:
        report.error("lora", "LoRA on the critic crashes in verl 0.9.1 (a LoRA model is "
                     "wrapped as a causal LM): use critic.model.lora_rank=0")  # fmt: skip
    if actor and use_critic and v1:
        report.error("lora", "a LoRA actor beside a critic crashes in verl 0.9.1's v1 trainer "
                     "('no attribute disable_adapter'): use trainer.use_v1=false")  # fmt: skip


def visible_gpus() -> list[tuple[str, float | None]]:
    return [(gpu.name, gpu.memory_gib) for gpu in gpus.listed()]


def check_gpu_count(wanted: int, report: Report) -> float | None:
    """This node's GPUs against ``wanted``; the card's GiB."""
    listed = visible_gpus()
    if not listed:
        report.note("gpu", "no NVIDIA GPU visible here: GPU count not checked")
        return None
    (name, gib), count = listed[0], len(listed)
    if count < wanted:
        report.error("gpu", f"trainer.n_gpus_per_node={wanted} but this node has {count} GPU(s)")
    else:
        memory = "memory not reported" if gib is None else f"{gib:.0f} GiB"
        report.ok("gpu", f"{count} x {name} ({memory}); this node uses {wanted}")
    return gib


def ray_cluster_gpus(address: str) -> tuple[list[dict[str, Any]] | None, str]:
    """The live nodes ({gpus, kind}) of the Ray cluster, or None; why not."""
    try:
        result = subprocess.run([sys.executable, "-c", _RAY_NODES, address], capture_output=True,
                                text=True, timeout=RAY_QUERY_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"no answer within {RAY_QUERY_TIMEOUT_S} s"
    lines = [ln.strip() for ln in (result.stdout + result.stderr).splitlines() if ln.strip()]
    if result.returncode != 0:
        return None, lines[-1][:200] if lines else f"exit status {result.returncode}"
    try:
        return json.loads(result.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, "unreadable answer"
