#!/usr/bin/env bash
# GSPO on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: a sequence-level importance ratio clipped to
# [1-3e-4, 1+4e-4], a mean over sequences; no KL.
# The algorithm's settings: configs/gsm8k_gspo.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/gspo_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe gspo_qwen2.5-0.5b_gsm8k --config gsm8k_gspo
  ROLLOUT_N=16                 # verl's GSPO example
  PPO_MINI_BATCH_SIZE=32       # 4 updates a step, as the GSPO paper's four minibatches
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
