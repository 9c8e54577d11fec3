#!/usr/bin/env bash
# REINFORCE++ on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: no critic, no group; KL in the
# reward, advantages whitened over the batch.
# The algorithm's settings: configs/gsm8k_reinforce_pp.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/reinforce_pp_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe reinforce_pp_qwen2.5-0.5b_gsm8k --config gsm8k_reinforce_pp
  ROLLOUT_N=1                  # no group needed
  PPO_MINI_BATCH_SIZE=128      # one update a step (mini-batch = batch), as verl's example
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
