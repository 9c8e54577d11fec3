#!/usr/bin/env bash
# DAPO on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: clip-higher, token-level loss, dynamic
# sampling on accuracy (groups all right or all wrong are dropped and more prompts generated:
# a step generates more than TRAIN_BATCH_SIZE x ROLLOUT_N responses), the overlong penalty; no KL.
# The algorithm's settings: configs/gsm8k_dapo.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/dapo_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe dapo_qwen2.5-0.5b_gsm8k --config gsm8k_dapo
  ROLLOUT_N=16                 # the paper's group size
  PPO_MINI_BATCH_SIZE=8        # 16 updates a step, as verl's DAPO example (512 prompts, 32 each)
  OVERLONG_BUFFER_LEN=auto     # a fifth of MAX_RESPONSE_LENGTH, as the paper's 4096 of 20480
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
