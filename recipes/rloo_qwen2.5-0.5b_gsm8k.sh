#!/usr/bin/env bash
# RLOO on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: no critic, each response's baseline the mean
# reward of the other ROLLOUT_N-1 responses to its prompt, KL to the reference in the reward.
# The algorithm's settings: configs/gsm8k_rloo.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/rloo_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe rloo_qwen2.5-0.5b_gsm8k --config gsm8k_rloo
  ROLLOUT_N=4                  # the paper's best k
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
