#!/usr/bin/env bash
# Supervised fine-tuning (SFT) on GSM8K's worked solutions, Qwen2.5-0.5B-Instruct, one GPU: verl's
# SFT trainer (torchrun -m verl_gsm8k.sft_trainer, FSDP2), loss on the answer tokens only. The
# prompts are exactly the PPO recipes' prompts; the merged result is a MODEL_PATH for them.
#   python -m data_prep.sft                              # -> ~/data/gsm8k-sft/{train,test}.parquet
#   DRY_RUN=1 bash recipes/sft_qwen2.5-0.5b_gsm8k.sh     # preflight + final config, no GPU
#   bash recipes/sft_qwen2.5-0.5b_gsm8k.sh               # train (NVIDIA GPU; DEVICE=cpu: the CPU)
#   bash scripts/merge.sh runs/sft_qwen2.5-0.5b_gsm8k merged/sft-0.5b
#   MODEL_PATH=merged/sft-0.5b bash recipes/ppo_qwen2.5-0.5b_gsm8k.sh
# Every knob is an environment variable (docs/knobs.md); key=value arguments win over all.
set -euo pipefail

recipe=(
  --recipe sft_qwen2.5-0.5b_gsm8k --config gsm8k_sft --trainer sft
  TRAIN_BATCH_SIZE=64          # examples per optimizer step: 116 steps per GSM8K epoch
  TOTAL_EPOCHS=3               # (TOTAL_TRAINING_STEPS alone: as many epochs as steps)
  SAVE_FREQ=100
  TEST_FREQ=50                 # validation loss on the test split (1319 examples)
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
