"""The shapes of the Qwen2.5 models the recipes train, from their published config.json."""

from typing import Any

_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "intermediate_size", "vocab_size", "tie_word_embeddings")  # fmt: skip
SHAPES: dict[str, dict[str, Any]] = {
    size: dict(zip(_KEYS, shape, strict=True), max_position_embeddings=32768)
    for size, shape in {
        "0.5B": (896, 24, 14, 2, 4864, 151936, True),
        "1.5B": (1536, 28, 12, 2, 8960, 151936, True),
        "3B": (2048, 36, 16, 2, 11008, 151936, True),
        "7B": (3584, 28, 28, 4, 18944, 152064, False),
    }.items()
}


def qwen25_config(size: str, **extra: Any) -> Any:
    """A transformers Qwen2Config of Qwen2.5-``size`` (0.5B, 1.5B, 3B, 7B), built offline."""
    from transformers import Qwen2Config

    if size not in SHAPES:
        raise ValueError(f"unknown Qwen2.5 size '{size}'; known: {', '.join(SHAPES)}")
    return Qwen2Config(**SHAPES[size], **extra)
