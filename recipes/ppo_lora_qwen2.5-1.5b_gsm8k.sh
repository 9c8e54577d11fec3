#!/usr/bin/env bash
# PPO with a LoRA actor and a full critic on GSM8K with Qwen2.5-1.5B-Instruct, one 24 GB GPU.
# The actor trains adapters on frozen base weights (the base without them is the reference); the
# critic trains fully with its states offloaded to host memory. verl's legacy trainer: see
# configs/gsm8k_ppo_lora.yaml and recipes/README.md for why.
#   DRY_RUN=1 bash recipes/ppo_lora_qwen2.5-1.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe ppo_lora_qwen2.5-1.5b_gsm8k --config gsm8k_ppo_lora
  MODEL_PATH=Qwen/Qwen2.5-1.5B-Instruct
  TRAIN_BATCH_SIZE=64
  PPO_MINI_BATCH_SIZE=32
  ACTOR_LR=1e-5                # adapters need a larger step than full fine-tuning
  CRITIC_LR=1e-5
  LORA_RANK=32
  LORA_ALPHA=32
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
