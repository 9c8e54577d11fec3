#!/usr/bin/env bash
# Two PPO steps on a few dozen GSM8K prompts, with validation and a checkpoint at step 2.
# Proves the whole loop end to end (vLLM rollout, reward, reference, critic, GAE, FSDP updates,
# weight sync, checkpoint) in minutes:
#   bash recipes/smoke_tiny.sh          # GPU: Qwen2.5-0.5B-Instruct; no GPU: trains on the CPU
#   MODEL_PATH=/path/to/local/model bash recipes/smoke_tiny.sh
# Without a GPU it trains a tiny random Qwen2 built offline on the GSM8K sample shipped in
# data_prep/sample (docs/cpu.md): no hub, no GPU, no setting needed.
set -euo pipefail

recipe=(
  --recipe smoke_tiny --config gsm8k_ppo
  --cpu-by-default             # no GPU: train on the CPU instead of stopping
  TRAIN_BATCH_SIZE=16
  PPO_MINI_BATCH_SIZE=8
  MAX_RESPONSE_LENGTH=128
  TOTAL_TRAINING_STEPS=2
  SAVE_FREQ=2
  TEST_FREQ=2
  SMOKE_PROMPTS=32             # train and validation prompts used
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
