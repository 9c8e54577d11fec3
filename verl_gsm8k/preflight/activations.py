"""Bytes a micro-batch's pass holds at its peak, beyond the model's states, as verl 0.9.1 runs it
(verl/workers/engine/fsdp/transformer_impl.py ``prepare_model_outputs``, verl/utils/
torch_functional.py). Measured against torch's tensor-bytes tracker on a Qwen2.5-0.5B shape
(fp32, CPU: tests/test_memory_measured.py) and against the CUDA allocator on an H100 (bf16
autocast, the recipes' 16384-token budget: verl_gsm8k/bench/gpu_probe.py, docs/gpu.md).

Per token, ``L`` the bytes of the compute dtype (the logits' dtype: bf16 under FSDP's autocast,
fp32 without it), ``V`` the vocabulary:

* log-probs with entropy (the old-log-prob pass; verl always asks for the entropy there):
  eager ``entropy_from_logits`` (verl's path without padding removal, or with
  ``use_torch_compile: false``) holds the logits, ``softmax(logits)`` and one more logits-sized
  fp32 tensor (``logsumexp``'s ``exp(x - max)`` or the product ``p * logits``): ``L + 8`` bytes
  per logit, plus a 4-byte fp32 copy of bf16 logits that CUDA autocast makes for ``logsumexp``
  (softmax, logsumexp and log_softmax are on autocast's fp32 list): 3x the logits in fp32, 7x
  bf16 logits. With padding removal verl compiles it (``use_torch_compile``, its default):
  inductor fuses the reductions; on CUDA (Triton) nothing logits-sized is kept beside the logits,
  ``L`` (measured on an H100: the packed pass with the compiled entropy holds what the reference
  pass holds). Inductor's CPU code keeps one fp32 (tokens, V) buffer (seen with
  TORCH_LOGS=output_code), which this GPU estimate leaves out.
* log-probs without entropy (the reference): the logits; without padding removal verl also
  concatenates the valid tokens' logits into a second copy (``torch.cat`` of the narrowed rows).
* an update's backward (log-probs with gradients): without flash-attn's cross entropy
  (``logprobs_from_logits_v2``), fp32 logits: the logsumexp input kept for backward and three
  logits-sized gradients at the start of the backward (the rows' gradients, their ``stack``,
  ``gather``'s scatter), ``4 + 3 L`` (measured on the CPU); bf16 logits: the rows' fp32
  log-softmax kept for backward (4 bytes) and one bf16 gradient the rows' backward fills row by
  row, ``4 + L`` (measured on an H100: 6.5 bytes a logit with the probe's bf16 weight casts);
  the rows' gradients are computed on the valid tokens, so padding adds only to the forward's
  peak, which this estimate over-counts by the padding factor; with flash-attn's
  in-place cross entropy (padding removal with the flash_attn package) the logits alone, ``L``;
  padding removal under sdpa (packed rows, no flash_attn) keeps the torch path.
  Each layer's checkpointed input (gradient checkpointing) and a few hidden-sized tensors come
  on top.
* the critic (a 1-wide value head): one layer's working set, the MLP's three intermediate-sized
  tensors and a few hidden-sized ones.

The end of an update adds two peaks of its own, where the gradients are complete: a tied
embedding's gradient is summed from the LM head's and the embedding's (three vocabulary x hidden
tensors live at once), and Adam's step holds temporaries (CUDA: ``_multi_tensor_adam``'s
``sqrt(exp_avg_sq)`` of every trained parameter; CPU, single-tensor: two of the largest).
"""

from __future__ import annotations

from typing import Any

FP32 = 4  # softmax, logsumexp, log_softmax outputs under CUDA autocast; Adam's sqrt in fp32
HIDDEN_TENSORS = 3  # hidden-sized tensors beside the logits (final norm in and out, its grad)
VALUE_HIDDEN_TENSORS = 4  # hidden-sized tensors of a layer's forward beside its MLP
MLP_TENSORS = 3  # gate, up and act(gate) * up, each intermediate-sized


def logprob_pass(
    hf_config: Any, tokens: int, compute: int, entropy: bool, rmpad: bool, compiled: bool = False
) -> int:
    """A forward pass's log-probs (no gradients): logits and their temporaries at the peak;
    ``compiled``: verl compiles the entropy (padding removal and use_torch_compile)."""
    vocab, hidden = hf_config.vocab_size, hf_config.hidden_size
    if entropy and compiled and rmpad:
        per_logit = compute  # CUDA's fused kernels: measured on an H100 (docs/gpu.md)
    elif entropy:
        per_logit = compute + 2 * FP32 + (FP32 if compute < FP32 else 0)
    else:
        per_logit = compute * (1 if rmpad else 2)
    return tokens * (vocab * per_logit + hidden * compute)


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
    """An update's forward and the start of its backward: checkpointed layer inputs, hidden-sized
    tensors and, with an LM head, the logits kept for backward and their gradients.
    ``flash_ce``: verl's log-probs go through flash-attn's in-place cross entropy, which it takes
    only with padding removal and the ``flash_attn`` (2.x) package; default: ``rmpad``. Padding
    removal under sdpa (no flash_attn) uses the torch path: ``4 + 3 L`` per logit in fp32,
    ``4 + L`` in bf16 (module docstring)."""
    h = hf_config.hidden_size
    saved = tokens * h * (hf_config.num_hidden_layers + HIDDEN_TENSORS) * compute
    if not lm_head:
        return saved
    flash_ce = rmpad if flash_ce is None else flash_ce
    if rmpad and flash_ce:
        per_logit = compute
    else:
        per_logit = FP32 + (compute if compute < FP32 else 3 * compute)
    return saved + tokens * hf_config.vocab_size * per_logit


def embedding_backward(hf_config: Any, grad_bytes: int, trained: bool) -> int:
    """Beyond the complete gradients at the end of a backward: a tied embedding trained (not a
    LoRA base) has its gradient summed from two (three vocabulary x hidden tensors for one)."""
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    return 2 * hf_config.vocab_size * hf_config.hidden_size * grad_bytes if tied and trained else 0


def adam_step(trained: float, largest: float, foreach: bool) -> float:
    """Adam's temporaries beside weights, gradients and moments, in the unit of ``trained`` (all
    trained parameters) and ``largest`` (the largest one), both sized in the moments' dtype:
    CUDA's multi-tensor step keeps ``sqrt(exp_avg_sq)`` of every trained parameter; the CPU's
    single-tensor step two of the largest parameter's."""
    return trained if foreach else 2 * largest
