#!/usr/bin/env bash
# PPO (actor + critic + reference + rule reward) on GSM8K with Qwen2.5-0.5B-Instruct, one GPU.
#   DRY_RUN=1 bash recipes/ppo_qwen2.5-0.5b_gsm8k.sh      # preflight + final config, no GPU
#   bash recipes/ppo_qwen2.5-0.5b_gsm8k.sh trainer.total_epochs=5
# Every knob is an environment variable (docs/knobs.md); key=value arguments win over all.
# The launch itself: python -m verl_gsm8k.launch (docs/architecture.md).
set -euo pipefail

recipe=(
  --recipe ppo_qwen2.5-0.5b_gsm8k --config gsm8k_ppo
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
