"""The critic's attention: verl hard-codes flash_attention_2 (verl/utils/model.py ~649,
load_valuehead_model), failing without flash-attn 2: rewritten to common/attention.py's
choice."""

import functools
import logging
import os
from typing import Any

from transformers import PreTrainedModel

from verl_gsm8k.common.attention import Choice, probe

logger = logging.getLogger(__name__)


def rewrite(requested: Any, choice: Choice) -> Any:
    """A flash_attention_* request other than the choice becomes the choice; the rest stays."""
    flash = isinstance(requested, str) and requested.startswith("flash_attention")
    if flash and requested != choice.implementation:
        logger.warning("attention: %s -> %s (%s)", requested, choice.implementation, choice.why)
        return choice.implementation
    return requested


def current_choice() -> Choice:
    """ATTENTION as the launcher exported it; DEVICE=cpu shows here as VERL_PLATFORM=cpu."""
    return probe(os.environ.get("ATTENTION", "auto"), os.environ.get("VERL_PLATFORM") == "cpu")


def install() -> bool:
    """transformers' PreTrainedModel._check_and_adjust_attn_implementation (where every
    from_pretrained resolves its attention) maps flash_attention_* to the choice; True when the
    patch is on (the choice is not flash-attn 2)."""
    original = PreTrainedModel._check_and_adjust_attn_implementation
    if getattr(original, "_verl_sdpa_fallback", False):
        return True
    choice = current_choice()
    if choice.name == "fa2":
        return False

    @functools.wraps(original)
    def check_and_adjust(self: Any, attn_implementation: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, rewrite(attn_implementation, choice), *args, **kwargs)

    check_and_adjust._verl_sdpa_fallback = True  # type: ignore[attr-defined]
    PreTrainedModel._check_and_adjust_attn_implementation = check_and_adjust  # type: ignore
    return True


install()
