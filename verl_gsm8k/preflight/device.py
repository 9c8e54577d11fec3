"""How a composed config runs on this machine: the device, the attention path, the LoRA layouts
verl 0.9.1 cannot train, and the GPUs (nvidia-smi, or a Ray cluster's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from verl_gsm8k.common import gpus
from verl_gsm8k.common.attention import (
    AttentionRefused,
    Choice,
    fa4_installed,
    fa4_problem,
    flash_attn_problem,
    gpu_capabilities,
    probe,
    statement,
)
from verl_gsm8k.preflight.lines import Report

FALLBACK_MODULE = "verl_gsm8k.verl_plugins.attention_fallback"
CPU_MODULE = "verl_gsm8k.verl_plugins.cpu_platform"


def lora_rank(model_cfg: Any) -> int:
    """The LoRA rank a model config asks for (lora.rank or lora_rank); 0 without LoRA."""
    rank = int(model_cfg.get("lora", {}).get("rank", 0) or 0)
    return rank if rank > 0 else int(model_cfg.get("lora_rank", 0) or 0)


def attention(model_cfg: Any) -> str:
    """The attention implementation verl asks transformers for (its default: flash-attn 2)."""
    override = model_cfg.get("override_config", None) or {}
    return str(override.get("attn_implementation", None) or "flash_attention_2")


def _modules() -> list[str]:
    return [m.strip() for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")]


def unusable(implementation: str, choice: Choice) -> str | None:
    """Why a flash-attention implementation the config asks for cannot run here, or None."""
    if not implementation.startswith("flash_attention") or implementation == choice.implementation:
        return None
    if implementation == "flash_attention_2":
        return flash_attn_problem()
    if implementation == "flash_attention_4":
        return fa4_problem(gpu_capabilities(), fa4_installed())
    return f"{implementation} is not a path this project sets up"


def check_device(
    cfg: Any, use_critic: bool, report: Report, model: Any = None, who: str = "actor"
) -> None:
    """Where the run trains and with which attention, and why (the launch line's words), or the
    mismatch that would fail in a worker. ``model``: the block to read (default the actor's)."""
    device = cfg.trainer.device
    platform = os.environ.get("VERL_PLATFORM") == "cpu" and CPU_MODULE in _modules()
    if device == "cpu" and not platform:
        report.error(
            "device",
            "trainer.device=cpu needs verl's cpu platform (VERL_PLATFORM=cpu "
            f"and VERL_USE_EXTERNAL_MODULES={CPU_MODULE}): launch with DEVICE=cpu",
        )
        return
    try:
        choice = probe(os.environ.get("ATTENTION", "auto"), on_cpu=device == "cpu")
    except AttentionRefused as refused:
        report.error("attention", str(refused))
        return
    model = cfg.actor_rollout_ref.model if model is None else model
    implementation, packed = attention(model), bool(model.use_remove_padding)
    why_not = unusable(implementation, choice)
    suffix = "" if who == "actor" else "_sft"
    if why_not is not None:  # the machine that trains may have it: a warning
        report.warn(
            "attention",
            f"{why_not} here but the {who} asks for {implementation}: on a "
            f"machine without it, add +attention={choice.overlay or 'sdpa'}{suffix} (the "
            "recipes do it themselves)",
        )
        return
    flash2 = flash_attn_problem()
    if use_critic and flash2 is not None and FALLBACK_MODULE not in _modules():
        report.warn(
            "attention",
            f"{flash2} here and verl loads the critic with a hard-coded "
            f"flash_attention_2 (verl issue #5210): load {FALLBACK_MODULE} "
            f"(VERL_USE_EXTERNAL_MODULES={FALLBACK_MODULE}; the recipes do it "
            "themselves)",
        )
        return
    if (implementation, packed) == (choice.implementation, choice.padding_removal):
        path = choice.line()  # the launch line's own words
    else:
        atn = os.environ.get("ATTENTION", "auto")
        path = statement(
            implementation,
            packed,
            f"set by the overrides; ATTENTION={atn} chooses {choice.name} here: {choice.why}",
        )
    where = "the CPU (verl's cpu platform)" if device == "cpu" else device
    report.ok("device", f"trains on {where}; attention: {path}")


def check_lora(cfg: Any, use_critic: bool, report: Report) -> None:
    """The LoRA layouts that crash in verl 0.9.1, refused with the reason."""
    if lora_rank(cfg.critic.model) > 0 and use_critic:
        report.error(
            "lora",
            "LoRA on the critic crashes in verl 0.9.1: it wraps every LoRA model "
            "as a PEFT causal LM and the critic is a token classifier (AttributeError: "
            "... 'prepare_inputs_for_generation'); train the critic fully "
            "(critic.model.lora_rank=0)",
        )
    if (
        lora_rank(cfg.actor_rollout_ref.model) > 0
        and use_critic
        and cfg.trainer.get("use_v1", True)
    ):
        report.error(
            "lora",
            "a LoRA actor beside a critic crashes in verl 0.9.1's v1 trainer (the "
            "reference pass's no_lora_adapter flag reaches the critic: 'no attribute "
            "disable_adapter'); use trainer.use_v1=false (configs/gsm8k_ppo_lora.yaml "
            "does)",
        )


def visible_gpus() -> list[tuple[str, float | None]]:
    """(name, GiB or None) of each NVIDIA GPU nvidia-smi lists; [] without one."""
    return [(gpu.name, gpu.memory_gib) for gpu in gpus.listed()]


def check_gpu_count(wanted: int, report: Report) -> float | None:
    """This node's GPUs against ``wanted``; the card's GiB (None: no GPU, or not reported)."""
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


# How long the preflight waits for a Ray cluster to answer (ray.init + ray.nodes in a child).
RAY_QUERY_TIMEOUT_S = 30
_RAY_NODES = """
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
kind = "accelerator_type:"
nodes = [{"ip": n["NodeManagerAddress"], "gpus": n["Resources"].get("GPU", 0.0),
          "kind": sorted(k[len(kind):] for k in n["Resources"] if k.startswith(kind))}
         for n in ray.nodes() if n["Alive"]]
print(json.dumps(nodes))
"""


def ray_cluster_gpus(address: str) -> tuple[list[dict[str, Any]] | None, str]:
    """The live nodes ({ip, gpus, kind}) of the Ray cluster at ``address``, or None and why,
    asked in a child: a cluster that does not answer costs RAY_QUERY_TIMEOUT_S at most."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", _RAY_NODES, address],
            capture_output=True,
            text=True,
            timeout=RAY_QUERY_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None, f"no answer within {RAY_QUERY_TIMEOUT_S} s"
    if result.returncode != 0:
        lines = [ln for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        return None, (lines[-1].strip()[:200] if lines else f"exit status {result.returncode}")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, "unreadable answer"
