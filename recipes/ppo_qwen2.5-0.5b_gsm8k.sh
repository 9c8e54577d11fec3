#!/usr/bin/env bash
# PPO (actor + critic + reference + rule reward) on GSM8K with Qwen2.5-0.5B-Instruct, one GPU.
#   DRY_RUN=1 bash recipes/ppo_qwen2.5-0.5b_gsm8k.sh      # preflight + final config, no GPU
#   bash recipes/ppo_qwen2.5-0.5b_gsm8k.sh trainer.total_epochs=5
# Every knob is an environment variable (docs/guide.md, Knobs); key=value arguments win over all.
set -euo pipefail

RECIPE=ppo_qwen2.5-0.5b_gsm8k
CONFIG_NAME=gsm8k_ppo
DEFAULT_MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "$@"
