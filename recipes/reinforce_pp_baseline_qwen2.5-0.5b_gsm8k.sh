#!/usr/bin/env bash
# REINFORCE++-baseline on GSM8K with Qwen2.5-0.5B-Instruct, one GPU: no critic, the group's mean
# reward as baseline, then whitened over the batch; KL in the reward.
# The algorithm's settings: configs/gsm8k_reinforce_pp_baseline.yaml; the paper and its cost: docs/algorithms.md.
#   DRY_RUN=1 bash recipes/reinforce_pp_baseline_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

RECIPE=reinforce_pp_baseline_qwen2.5-0.5b_gsm8k
CONFIG_NAME=gsm8k_reinforce_pp_baseline
DEFAULT_MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct
ROLLOUT_N=${ROLLOUT_N:-8}                       # verl's example
ROLLOUT_GPU_MEM_UTIL=${ROLLOUT_GPU_MEM_UTIL:-0.5}   # no critic on the GPU: vLLM gets more

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "$@"
