#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: no critic, ROLLOUT_N responses per prompt,
# group-normalised rewards as advantages, KL to the reference as a loss term (KL_COEF).
#   DRY_RUN=1 bash recipes/grpo_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

RECIPE=grpo_qwen2.5-0.5b_gsm8k
CONFIG_NAME=gsm8k_grpo
DEFAULT_MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct
ROLLOUT_N=${ROLLOUT_N:-5}                 # GRPO needs a group per prompt
ROLLOUT_GPU_MEM_UTIL=${ROLLOUT_GPU_MEM_UTIL:-0.5}   # no critic on the GPU: vLLM gets more

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "$@"
