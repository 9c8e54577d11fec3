"""The attention the launcher chose, wherever verl 0.9.1 asks for flash-attention 2 without a key.

verl loads the critic through verl/utils/model.py::load_valuehead_model (~649), which hard-codes
attn_implementation="flash_attention_2" (reported upstream:
https://github.com/verl-project/verl/issues/5210): without the flash_attn package, PPO with a critic
fails to start on a CPU and on any GPU machine without flash-attn ("... is not a value head model,
please install trl"). The actor's (and the reference's) attention is a config key
(actor_rollout_ref.model.override_config.attn_implementation), which the launcher's overlay sets
(configs/attention/sdpa_packed.yaml, sdpa.yaml, fa4.yaml); the critic has no such key, so its
request is rewritten here to the same choice: ``sdpa`` (PyTorch attention, packed or padded: the
overlay sets the critic's padding removal) where flash-attn 2 is not used, ``flash_attention_4``
where ATTENTION=fa4 asked for it (compute capability 9.0+).

Loaded by verl in every process through VERL_USE_EXTERNAL_MODULES, as
verl_gsm8k.verl_plugins.attention_fallback (the launcher adds it when the choice is not
flash-attn 2). It changes nothing where flash-attention 2 works: the plugin decides with the same
function as the launcher and the preflight, verl_gsm8k/common/attention.py (the ATTENTION knob,
which the launcher exports; flash-attn 2's extension loads or not; under ATTENTION=fa4,
flash-attn-4 and the compute capability nvidia-smi reports, read without creating a CUDA context).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from transformers import PreTrainedModel

from verl_gsm8k.common.attention import Choice, probe

logger = logging.getLogger(__name__)


def rewrite(requested: Any, choice: Choice) -> Any:
    """The implementation to load for a request: a flash_attention_* other than the choice
    becomes the choice; anything else (sdpa, eager, the choice itself) stays."""
    target = choice.implementation
    flash = isinstance(requested, str) and requested.startswith("flash_attention")
    if flash and requested != target:
        logger.warning("attention: %s -> %s (%s)", requested, target, choice.why)
        return target
    return requested


def current_choice() -> Choice:
    """The launcher's choice, decided again in this process (ATTENTION, exported by the launcher;
    DEVICE=cpu shows here as VERL_PLATFORM=cpu)."""
    return probe(os.environ.get("ATTENTION", "auto"), os.environ.get("VERL_PLATFORM") == "cpu")


def install() -> bool:
    """Patch transformers' PreTrainedModel._check_and_adjust_attn_implementation (the one place
    every from_pretrained resolves its attention) to map flash_attention_* to the choice (sdpa or
    flash_attention_4). True when the patch is active (the choice is not flash-attn 2)."""
    original = PreTrainedModel._check_and_adjust_attn_implementation
    if getattr(original, "_verl_sdpa_fallback", False):
        return True
    choice = current_choice()
    if choice.name == "fa2":
        return False

    @functools.wraps(original)
    def check_and_adjust(self, attn_implementation, *args: Any, **kwargs: Any):
        return original(self, rewrite(attn_implementation, choice), *args, **kwargs)

    check_and_adjust._verl_sdpa_fallback = True  # type: ignore[attr-defined]
    PreTrainedModel._check_and_adjust_attn_implementation = check_and_adjust  # type: ignore[method-assign]
    return True


install()
