#!/usr/bin/env bash
# Dr. GRPO on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: GRPO without the std normalisation and
# with a constant loss divisor (the maximum response length); no KL.
# The algorithm's settings: configs/gsm8k_drgrpo.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/drgrpo_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe drgrpo_qwen2.5-0.5b_gsm8k --config gsm8k_drgrpo
  ROLLOUT_N=8                  # the paper's group size
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
