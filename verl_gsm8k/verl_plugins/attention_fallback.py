"""PyTorch attention (sdpa) wherever verl 0.9.1 asks for flash-attention and it cannot be used.

verl loads the critic through verl/utils/model.py::load_valuehead_model (~649), which hard-codes
attn_implementation="flash_attention_2" (upstream verl issue #5210): without the flash_attn
package, PPO with a critic fails to start on a CPU and on any GPU machine without flash-attn
("... is not a value head model, please install trl"). The actor's attention is a config key
(actor_rollout_ref.model.override_config.attn_implementation), which the launcher sets to sdpa in
the same situation; the critic has no such key, so its request is rewritten here.

Loaded by verl in every process through VERL_USE_EXTERNAL_MODULES, as
verl_gsm8k.verl_plugins.attention_fallback (recipes/common.sh adds it when flash-attention cannot
be used). It changes nothing where flash-attention works: both decide with the same probe,
verl_gsm8k/common/flash_attention.py, which loads flash-attn's CUDA extension (a wheel built for
another torch or CUDA is installed but does not load, and counts as absent).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from transformers import PreTrainedModel

from verl_gsm8k.common.flash_attention import flash_attn_problem

FALLBACK = "sdpa"
logger = logging.getLogger(__name__)


def _rewrite(requested: Any, why: str) -> Any:
    if isinstance(requested, str) and requested.startswith("flash_attention"):
        logger.warning("%s: %s -> %s (PyTorch attention)", why, requested, FALLBACK)
        return FALLBACK
    return requested


def install() -> bool:
    """Patch transformers' PreTrainedModel._check_and_adjust_attn_implementation (the one place
    every from_pretrained resolves its attention) to map flash_attention_* to sdpa. True when the
    patch is active."""
    original = PreTrainedModel._check_and_adjust_attn_implementation
    if getattr(original, "_verl_sdpa_fallback", False):
        return True
    why = flash_attn_problem()
    if why is None:
        return False

    @functools.wraps(original)
    def check_and_adjust(self, attn_implementation, *args: Any, **kwargs: Any):
        return original(self, _rewrite(attn_implementation, why), *args, **kwargs)

    check_and_adjust._verl_sdpa_fallback = True  # type: ignore[attr-defined]
    PreTrainedModel._check_and_adjust_attn_implementation = check_and_adjust  # type: ignore[method-assign]
    return True


install()
