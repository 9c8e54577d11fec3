#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: no critic, ROLLOUT_N responses per prompt,
# group-normalised rewards as advantages, KL to the reference as a loss term (KL_COEF).
#   DRY_RUN=1 bash recipes/grpo_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe grpo_qwen2.5-0.5b_gsm8k --config gsm8k_grpo
  ROLLOUT_N=5                  # GRPO needs a group per prompt
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
