"""Preflight checks of how a composed config will run on this machine's stack: the device, the
attention path, the LoRA layouts verl 0.9.1 cannot train, and the GPUs nvidia-smi lists. Each
reports one line. The SFT preflight (sft.py) shares the CPU platform check and the GPU listing."""

from __future__ import annotations

import os
import subprocess
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
# The SFT memory estimate: bytes per parameter kept on the GPU for a model that trains (fp32
# weights 4 + fp32 grads 4 + Adam moments 8). PPO's per-phase estimate: memory.py.
TRAINED_BYTES_PER_PARAM = 16


def lora_rank(model_cfg: Any) -> int:
    """The LoRA rank a model config asks for (lora.rank or lora_rank); 0 without LoRA."""
    rank = int(model_cfg.get("lora", {}).get("rank", 0) or 0)
    return rank if rank > 0 else int(model_cfg.get("lora_rank", 0) or 0)


def _loaded_modules() -> list[str]:
    return [m.strip() for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")]


def attention(model_cfg: Any) -> str:
    """The attention implementation verl will ask transformers for (its default: flash-attn 2)."""
    override = model_cfg.get("override_config", {}) or {}
    return str(override.get("attn_implementation", "flash_attention_2"))


def cpu_platform_missing(device: str) -> str | None:
    """Why verl cannot run trainer.device=``device`` in this environment, or None."""
    if device != "cpu":
        return None
    if os.environ.get("VERL_PLATFORM") == "cpu" and CPU_MODULE in _loaded_modules():
        return None
    return (
        "trainer.device=cpu needs verl's cpu platform (VERL_PLATFORM=cpu and "
        f"VERL_USE_EXTERNAL_MODULES={CPU_MODULE}): launch with DEVICE=cpu"
    )


def attention_choice(device: str, report: Report) -> Choice | None:
    """The launcher's choice for this machine (ATTENTION, default auto); None, with an error,
    where ATTENTION asks for what this machine cannot run."""
    try:
        return probe(os.environ.get("ATTENTION", "auto"), on_cpu=device == "cpu")
    except AttentionRefused as refused:
        report.error("attention", str(refused))
        return None


def attention_path(implementation: str, padding_removal: bool, choice: Choice) -> str:
    """The statement of the attention a config runs: the choice's own line where the config is
    what the launcher chose (one source for the launch line and this one), else what the config
    says and that its overrides set it."""
    if (implementation, padding_removal) == (choice.implementation, choice.padding_removal):
        return choice.line()
    return statement(
        implementation,
        padding_removal,
        f"set by the overrides; ATTENTION={os.environ.get('ATTENTION', 'auto')} chooses "
        f"{choice.name} here: {choice.why}",
    )


def unusable(implementation: str, choice: Choice) -> str | None:
    """Why a flash-attention implementation the config asks for cannot run here, or None."""
    if not implementation.startswith("flash_attention") or implementation == choice.implementation:
        return None
    if implementation == "flash_attention_2":
        return flash_attn_problem()
    if implementation == "flash_attention_4":
        return fa4_problem(gpu_capabilities(), fa4_installed())
    return f"{implementation} is not a path this project sets up"


def model_attention(
    model: Any, choice: Choice, report: Report, who: str, suffix: str = ""
) -> tuple[str, bool] | None:
    """The attention and padding removal a config's model block asks for, or None after a
    warning when this machine cannot run that attention. A warning, not an error: the machine
    that trains may have it when this one does not (the recipes decide on the machine they launch
    from, with the overlay ``+attention=<choice><suffix>``)."""
    implementation = attention(model)
    why_not = unusable(implementation, choice)
    if why_not is not None:
        report.warn(
            "attention",
            f"{why_not} here but the {who} asks for {implementation}: on a machine without it, "
            f"add +attention={choice.overlay or 'sdpa'}{suffix} (the recipes do it themselves)",
        )
        return None
    return implementation, bool(model.use_remove_padding)


def check_device(cfg: Any, use_critic: bool, report: Report) -> None:
    """Device and attention: what the run will use and why, and the mismatches that fail in a
    worker."""
    device = cfg.trainer.device
    modules = _loaded_modules()
    missing = cpu_platform_missing(device)
    if missing:
        report.error("device", missing)
        return
    choice = attention_choice(device, report)
    if choice is None:
        return
    asked = model_attention(cfg.actor_rollout_ref.model, choice, report, "actor")
    if asked is None:
        return
    actor, padding_removal = asked
    flash2 = flash_attn_problem()
    if use_critic and flash2 is not None and FALLBACK_MODULE not in modules:
        report.warn(
            "attention",
            f"{flash2} here and verl loads the critic with a hard-coded "
            f"flash_attention_2 (verl issue #5210): load {FALLBACK_MODULE} "
            f"(VERL_USE_EXTERNAL_MODULES={FALLBACK_MODULE}; the "
            "recipes do it themselves)",
        )
        return
    where = "the CPU (vLLM's CPU build, logical GPUs in Ray)" if device == "cpu" else device
    path = attention_path(actor, padding_removal, choice)
    report.ok("device", f"trains on {where}; attention: {path}")


def check_lora(cfg: Any, use_critic: bool, report: Report) -> None:
    """The LoRA layouts that crash in verl 0.9.1, refused with the reason."""
    if lora_rank(cfg.critic.model) > 0 and use_critic:
        report.error(
            "lora",
            "LoRA on the critic crashes in verl 0.9.1: it wraps every LoRA model as a PEFT causal "
            "LM and the critic is a token classifier (AttributeError: ... "
            "'prepare_inputs_for_generation'); train the critic fully (critic.model.lora_rank=0)",
        )
    actor_rank = lora_rank(cfg.actor_rollout_ref.model)
    if actor_rank > 0 and use_critic and cfg.trainer.get("use_v1", True):
        report.error(
            "lora",
            "a LoRA actor beside a critic crashes in verl 0.9.1's v1 trainer (the reference "
            "pass's no_lora_adapter flag reaches the critic: 'no attribute disable_adapter'); "
            "use trainer.use_v1=false (configs/gsm8k_ppo_lora.yaml does)",
        )


def visible_gpus() -> list[tuple[str, float | None]]:
    """(name, memory GiB or None where not reported) of each NVIDIA GPU nvidia-smi reports
    (common/gpus.py); [] without one."""
    return [(gpu.name, gpu.memory_gib) for gpu in gpus.listed()]


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
    """The live nodes of the Ray cluster at ``address`` ({ip, gpus, kind}) from ray.nodes(), or
    None and why not. Asked in a child process, so that a cluster that does not answer costs
    RAY_QUERY_TIMEOUT_S at most and this process never joins it."""
    import json
    import sys

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
