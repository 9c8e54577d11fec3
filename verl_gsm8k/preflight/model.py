"""Where the model a launch names comes from, for both preflights (cli.py: PPO; sft.py: SFT): a
local directory, the Hugging Face cache, or the hub (probed once, quickly, so that an offline
machine fails in seconds); and its parameter count from its config."""

from __future__ import annotations

import functools
import os

from verl_gsm8k.preflight.lines import Report

HUB_PROBE_TIMEOUT_S = 5.0


def is_hub_id(path: str) -> bool:
    return (
        not os.path.exists(os.path.expanduser(path))
        and not path.startswith(("/", ".", "~"))
        and path.count("/") == 1
    )


@functools.cache
def hub_reachable() -> tuple[bool, str]:
    from data_prep.gsm8k import hub_unreachable

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False, f"{endpoint} (HF_HUB_OFFLINE=1 is set)"
    reason = hub_unreachable(timeout=HUB_PROBE_TIMEOUT_S)
    return reason is None, endpoint if reason is None else f"{endpoint} ({reason})"


def offline_if_hub_unreachable() -> None:
    """Probe the hub once, first: where it cannot be reached, switch the libraries to offline
    mode, or verl's validate_config and the model loaders retry it for ~50 s before failing.
    (hub_reachable keeps the probe's answer, so the model check still names the real cause.)"""
    if os.environ.get("HF_HUB_OFFLINE") != "1" and not hub_reachable()[0]:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"


def cached_snapshot(repo_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, local_files_only=True)
    except Exception:
        return None


def resolve_model(role: str, path: str, report: Report) -> str | None:
    """A local directory verl can load from, or None (after reporting why)."""
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return local
    if not is_hub_id(path):
        report.error("model", f"{role} model path '{path}' does not exist")
        return None
    snapshot = cached_snapshot(path)
    if snapshot:
        report.note("model", f"{role} model '{path}' found in the Hugging Face cache")
        return snapshot
    reachable, where = hub_reachable()
    if reachable:
        report.note(
            "model", f"{role} model '{path}' is not cached; verl will download it from {where}"
        )
    else:
        report.error(
            "model",
            f"{role} model '{path}' is a hub id, not cached here, and the hub cannot be reached "
            f"from this machine: {where}; download it where the hub is reachable "
            f"(huggingface-cli download {path} --local-dir DIR) and set MODEL_PATH=DIR",
        )
    return None


def count_parameters(hf_config) -> int:
    """Parameters of a dense decoder from its config (exact for Qwen2/Llama shapes)."""
    h = hf_config.hidden_size
    layers = hf_config.num_hidden_layers
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", heads)
    head_dim = getattr(hf_config, "head_dim", None) or h // heads
    inter = hf_config.intermediate_size
    vocab = hf_config.vocab_size
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2 + (heads + 2 * kv) * head_dim
    per_layer = attention + 3 * h * inter + 2 * h
    embeddings = vocab * h * (1 if getattr(hf_config, "tie_word_embeddings", False) else 2)
    return embeddings + layers * per_layer + h
