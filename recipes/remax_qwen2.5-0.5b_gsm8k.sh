#!/usr/bin/env bash
# ReMax on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: no critic; the baseline is one extra greedy
# response per prompt. Runs verl's LEGACY trainer (the v1 trainer has no ReMax baseline), guarded
# and traced as the other recipes: configs/gsm8k_remax.yaml.
# The algorithm's settings: configs/gsm8k_remax.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/remax_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe remax_qwen2.5-0.5b_gsm8k --config gsm8k_remax
  ROLLOUT_N=1                  # one sample + one greedy baseline
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
