"""PyTorch attention (sdpa) wherever verl 0.9.1 asks for flash-attention and flash_attn is absent.

verl loads the critic through verl/utils/model.py::load_valuehead_model (~649), which hard-codes
attn_implementation="flash_attention_2" (upstream verl issue #5210): without the flash_attn
package, PPO with a critic fails to start on a CPU and on any GPU machine without flash-attn
("... is not a value head model, please install trl"). The actor's attention is a config key
(actor_rollout_ref.model.override_config.attn_implementation), which the launcher sets to sdpa in
the same situation; the critic has no such key, so its request is rewritten here.

Loaded by verl in every process through VERL_USE_EXTERNAL_MODULES, as
verl_gsm8k.verl_plugins.attention_fallback (recipes/common.sh adds it when flash_attn cannot be
imported). It changes nothing when flash_attn is installed.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any

from transformers import PreTrainedModel

FALLBACK = "sdpa"
logger = logging.getLogger(__name__)


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _rewrite(requested: Any) -> Any:
    if isinstance(requested, str) and requested.startswith("flash_attention"):
        logger.warning(
            "flash_attn is not installed: %s -> %s (PyTorch attention)", requested, FALLBACK
        )
        return FALLBACK
    return requested


def install() -> bool:
    """Patch transformers' PreTrainedModel._check_and_adjust_attn_implementation (the one place
    every from_pretrained resolves its attention) to map flash_attention_* to sdpa. True when the
    patch is active."""
    original = PreTrainedModel._check_and_adjust_attn_implementation
    if flash_attn_installed():
        return False
    if getattr(original, "_verl_sdpa_fallback", False):
        return True

    @functools.wraps(original)
    def check_and_adjust(self, attn_implementation, *args: Any, **kwargs: Any):
        return original(self, _rewrite(attn_implementation), *args, **kwargs)

    check_and_adjust._verl_sdpa_fallback = True  # type: ignore[attr-defined]
    PreTrainedModel._check_and_adjust_attn_implementation = check_and_adjust  # type: ignore[method-assign]
    return True


install()
