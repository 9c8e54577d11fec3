#!/usr/bin/env bash
# GRPO on GSM8K with a calculator the model calls through verl's agent loop (tool_agent, Hermes
# <tool_call> parsing, TOOL_TURNS model turns), one GPU. Its rows first (docs/tools.md):
#   python -m data_prep.gsm8k --tools calculator --out-dir ~/data/gsm8k-calculator
#   DRY_RUN=1 bash recipes/grpo_calculator_qwen2.5-0.5b_gsm8k.sh
set -euo pipefail

recipe=(
  --recipe grpo_calculator_qwen2.5-0.5b_gsm8k --config gsm8k_grpo
  TOOLS=calculator             # the tool config, the tool_agent loop, TOOL_TURNS=3
  ROLLOUT_N=5                  # GRPO needs a group per prompt
  ROLLOUT_GPU_MEM_UTIL=0.5     # no critic on the GPU: vLLM gets more
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
