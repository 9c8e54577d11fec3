#!/usr/bin/env bash
# Smoke test of a fresh GPU install: PPO for two steps on a few dozen GSM8K prompts, with a
# checkpoint at step 2, in a few minutes. Proves vLLM, FSDP, Ray, the reward and checkpointing.
#   bash recipes/smoke_tiny.sh
#   MODEL_PATH=/path/to/local/model bash recipes/smoke_tiny.sh   # offline box
set -euo pipefail

RECIPE=smoke_tiny
CONFIG_NAME=gsm8k_ppo
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-16}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-8}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-128}
TOTAL_TRAINING_STEPS=${TOTAL_TRAINING_STEPS:-2}
SAVE_FREQ=${SAVE_FREQ:-2}
TEST_FREQ=${TEST_FREQ:-2}
SMOKE_PROMPTS=${SMOKE_PROMPTS:-32}       # train and validation prompts used
RECIPE_OVERRIDES=(
  "data.train_max_samples=$SMOKE_PROMPTS"
  "data.val_max_samples=$SMOKE_PROMPTS"
)

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "$@"
