"""The shapes of the Qwen2.5 models the recipes train, kept here so that the preflight's memory
model, the per-card table (docs/gpu.md) and the GPU probe (verl_gsm8k/bench/gpu_probe.py) work
offline, without the hub or a downloaded config.

The facts are those of each model's published ``config.json`` on the Hugging Face hub
(Qwen/Qwen2.5-0.5B-Instruct, -1.5B-Instruct, -3B-Instruct, -7B-Instruct; the base models share
them except 7B's ``max_position_embeddings``, 131072), written down from those files, not
downloaded here. Only what the memory model reads is kept.
"""

from __future__ import annotations

from typing import Any

_SMALL = dict(vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768)
SHAPES: dict[str, dict[str, Any]] = {
    "0.5B": dict(
        _SMALL,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
    ),
    "1.5B": dict(
        _SMALL,
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
    ),
    "3B": dict(
        _SMALL,
        hidden_size=2048,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        intermediate_size=11008,
    ),
    "7B": dict(
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
    ),
}


def qwen25_config(size: str, **extra: Any) -> Any:
    """A transformers Qwen2Config of Qwen2.5-``size`` (0.5B, 1.5B, 3B, 7B), built offline."""
    from transformers import Qwen2Config

    if size not in SHAPES:
        raise ValueError(f"unknown Qwen2.5 size '{size}'; known: {', '.join(SHAPES)}")
    return Qwen2Config(**SHAPES[size], **extra)
