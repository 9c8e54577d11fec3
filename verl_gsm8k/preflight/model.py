"""The model a launch names: a local directory, the HF cache or the hub (probed once), loaded
by verl's HFModelConfig."""

import contextlib
import functools
import os
from typing import Any

from verl_gsm8k.preflight.lines import Report, one_line

HUB_PROBE_TIMEOUT_S = 5.0


@functools.cache
def hub_reachable() -> tuple[bool, str]:
    from data_prep.gsm8k import hub_unreachable

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False, f"{endpoint} (HF_HUB_OFFLINE=1 is set)"
    reason = hub_unreachable(timeout=HUB_PROBE_TIMEOUT_S)
    return reason is None, endpoint if reason is None else f"{endpoint} ({reason})"


def offline_if_hub_unreachable() -> None:
    """An unreachable hub: the libraries go offline (no ~50 s retries)."""
    if os.environ.get("HF_HUB_OFFLINE") != "1" and not hub_reachable()[0]:
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"


def resolve_model(role: str, path: str, report: Report) -> str | None:
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return local
    if os.path.exists(local) or path.startswith(("/", ".", "~")) or path.count("/") != 1:
        report.error("model", f"{role} model path '{path}' does not exist")
        return None
    from huggingface_hub import snapshot_download

    with contextlib.suppress(Exception):  # a hub id: cached?
        snapshot = snapshot_download(path, local_files_only=True)
        report.note("model", f"{role} model '{path}' found in the Hugging Face cache")
        return snapshot
    reachable, where = hub_reachable()
    if reachable:
        report.note("model", f"{role} model '{path}' is not cached; verl downloads it")
    else:
        report.error("model", f"{role} model '{path}' is a hub id, not cached here, and the hub "
                     f"cannot be reached from this machine: {where}; set MODEL_PATH to a "
                     "downloaded copy")  # fmt: skip
    return None


def load_model(role: str, model_cfg: Any, local: str, need: tuple[int, str], report: Report):
    """verl's HFModelConfig from ``local``, with a chat template and the context."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    model_cfg = model_cfg.copy()
    model_cfg.path = local
    try:
        hf = omega_conf_to_dataclass(model_cfg, dataclass_type=HFModelConfig)
    except Exception as exc:
        report.error("model", f"verl cannot load the {role} model at {local}: {one_line(exc)}")
        return None
    context = getattr(hf.hf_config, "max_position_embeddings", None)
    problems = [f"{need[1]} > context {context}"] if context and need[0] > context else []
    if not getattr(hf.tokenizer, "chat_template", None):
        problems.append("its tokenizer has no chat template (the data is chat messages)")
    for problem in problems:
        report.error("model", f"{role} model {local}: {problem}")
    if problems:
        return None
    params = count_parameters(hf.hf_config) / 1e9
    report.ok("model", f"{role}: verl loads {hf.hf_config.model_type} ({params:.2f}B params, "
              f"context {context}) and its chat template from {local}")  # fmt: skip
    return hf


def count_parameters(c: Any) -> int:
    h, heads = c.hidden_size, c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", heads)
    head_dim = getattr(c, "head_dim", None) or h // heads
    attention = (h * heads + h * kv) * head_dim * 2 + (heads + 2 * kv) * head_dim
    per_layer = attention + 3 * h * c.intermediate_size + 2 * h
    tied = getattr(c, "tie_word_embeddings", False)
    return c.vocab_size * h * (1 if tied else 2) + c.num_hidden_layers * per_layer + h
