#!/usr/bin/env bash
# Dr. GRPO on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: GRPO without the std normalisation and
# with a constant loss divisor (the maximum response length); no KL.
# The algorithm's settings: configs/gsm8k_drgrpo.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/drgrpo_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

RECIPE=drgrpo_qwen2.5-0.5b_gsm8k
CONFIG_NAME=gsm8k_drgrpo
DEFAULT_MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct
ROLLOUT_N=${ROLLOUT_N:-8}                       # the paper's group size
ROLLOUT_GPU_MEM_UTIL=${ROLLOUT_GPU_MEM_UTIL:-0.5}   # no critic on the GPU: vLLM gets more

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "$@"
