"""Bytes a micro-batch's pass holds at its peak beyond the model's states, as verl 0.9.1 runs it
(verl/workers/engine/fsdp/transformer_impl.py ``prepare_model_outputs``, verl/utils/
torch_functional.py). Per token, ``L`` bytes of the compute dtype (the logits'), ``V`` the
vocabulary; measured on the CPU (tests/test_memory_measured.py) and on an H100
(verl_gsm8k/bench/gpu_probe.py); the derivation of each term: docs/gpu.md.
"""

from __future__ import annotations

from typing import Any

FP32 = 4  # softmax, logsumexp, log_softmax outputs under CUDA autocast; Adam's sqrt
HIDDEN_TENSORS = 3  # hidden-sized tensors beside the logits (final norm in and out, its grad)
VALUE_HIDDEN_TENSORS = 4  # hidden-sized tensors of a layer's forward beside its MLP
MLP_TENSORS = 3  # gate, up and act(gate) * up, each intermediate-sized


def logprob_pass(
    hf_config: Any, tokens: int, compute: int, entropy: bool, rmpad: bool, compiled: bool = False
) -> int:
    """A forward pass's log-probs (no gradients). With the entropy: compiled with padding removal
    (CUDA's fused kernels) the logits alone; eager, the logits, softmax and one more fp32
    logits-sized tensor, plus autocast's fp32 copy of bf16 logits. Without it: the logits, and
    without padding removal their concatenated copy."""
    if entropy and compiled and rmpad:
        per_logit = compute
    elif entropy:
        per_logit = compute + 2 * FP32 + (FP32 if compute < FP32 else 0)
    else:
        per_logit = compute * (1 if rmpad else 2)
    return tokens * (hf_config.vocab_size * per_logit + hf_config.hidden_size * compute)


def value_pass(hf_config: Any, tokens: int, compute: int) -> int:
    """A critic's forward pass (no gradients): one layer's working set."""
    h, inter = hf_config.hidden_size, hf_config.intermediate_size
    return tokens * (MLP_TENSORS * inter + VALUE_HIDDEN_TENSORS * h) * compute


def update_pass(
    hf_config: Any,
    tokens: int,
    compute: int,
    lm_head: bool,
    rmpad: bool,
    flash_ce: bool | None = None,
) -> int:
    """An update's forward and the start of its backward: each layer's checkpointed input, a few
    hidden-sized tensors and, with an LM head, the logits kept for backward and their gradients:
    ``L`` with flash-attn's in-place cross entropy (``flash_ce``, default ``rmpad``), else torch's
    log-probs, ``4 + 3 L`` for fp32 logits and ``4 + L`` for bf16 ones."""
    h = hf_config.hidden_size
    saved = tokens * h * (hf_config.num_hidden_layers + HIDDEN_TENSORS) * compute
    if not lm_head:
        return saved
    if rmpad and (rmpad if flash_ce is None else flash_ce):
        per_logit = compute
    else:
        per_logit = FP32 + (compute if compute < FP32 else 3 * compute)
    return saved + tokens * hf_config.vocab_size * per_logit


def embedding_backward(hf_config: Any, grad_bytes: int, trained: bool) -> int:
    """Beyond the complete gradients at the end of a backward: a trained tied embedding's
    gradient summed from two (three vocabulary x hidden tensors live at once)."""
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    return 2 * hf_config.vocab_size * hf_config.hidden_size * grad_bytes if tied and trained else 0


def adam_step(trained: float, largest: float, foreach: bool) -> float:
    """Adam's step temporaries, in the unit of ``trained`` (every trained parameter) and
    ``largest`` (the largest one): CUDA's multi-tensor step keeps ``sqrt(exp_avg_sq)`` of all,
    the CPU's single-tensor step two of the largest."""
    return trained if foreach else 2 * largest
