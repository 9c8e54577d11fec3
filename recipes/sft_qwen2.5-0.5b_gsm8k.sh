#!/usr/bin/env bash
# Supervised fine-tuning (SFT) on GSM8K's worked solutions, Qwen2.5-0.5B-Instruct, one GPU: verl's
# SFT trainer (torchrun -m verl.trainer.sft_trainer, FSDP2), loss on the answer tokens only. The
# prompts are exactly the PPO recipes' prompts; the merged result is a MODEL_PATH for them.
#   python -m data_prep.sft                              # -> ~/data/gsm8k-sft/{train,test}.parquet
#   DRY_RUN=1 bash recipes/sft_qwen2.5-0.5b_gsm8k.sh     # preflight + final config, no GPU
#   bash recipes/sft_qwen2.5-0.5b_gsm8k.sh               # train (NVIDIA GPU; DEVICE=cpu: the CPU)
#   bash scripts/merge.sh runs/sft_qwen2.5-0.5b_gsm8k merged/sft-0.5b
#   MODEL_PATH=merged/sft-0.5b bash recipes/ppo_qwen2.5-0.5b_gsm8k.sh
# Every knob is an environment variable (docs/guide.md, Knobs); key=value arguments win over all.
set -euo pipefail

RECIPE=sft_qwen2.5-0.5b_gsm8k
CONFIG_NAME=gsm8k_sft
TRAINER=sft
DEFAULT_MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}  # examples per optimizer step: 116 steps per GSM8K epoch
# verl's SFT loop stops at TOTAL_EPOCHS even before TOTAL_TRAINING_STEPS (and then saves nothing):
# given a step count alone, allow as many epochs as steps (an epoch is at least one step).
if [[ -z "${TOTAL_EPOCHS:-}" && "${TOTAL_TRAINING_STEPS:-}" =~ ^[1-9][0-9]*$ ]]; then
  TOTAL_EPOCHS=$TOTAL_TRAINING_STEPS
fi
TOTAL_EPOCHS=${TOTAL_EPOCHS:-3}
SAVE_FREQ=${SAVE_FREQ:-100}
TEST_FREQ=${TEST_FREQ:-50}                # validation loss on the test split (1319 examples)

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "$@"
