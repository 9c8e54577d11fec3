#!/usr/bin/env bash
# Evaluate models on the GSM8K test split with EvalScope (pinned in pyproject's `eval` extra), in
# the training prompt mode and EvalScope's own mode, and write comparison.md / comparison.json.
# The driver is verl_gsm8k/evaluate/ (python -m verl_gsm8k.evaluate); it runs in the EvalScope
# environment (.venv-eval), never in .venv (EvalScope's antlr4 4.13 breaks verl's Hydra). On a
# GPU each model is served by vLLM from .venv; the server is always stopped at the end.
#
#   bash scripts/eval.sh --model Qwen/Qwen2.5-0.5B-Instruct --model ppo=merged/best \
#       --data ~/data/gsm8k [--modes training,evalscope] [--limit N] [--out DIR]
#   bash scripts/eval.sh --run runs/ppo_qwen2.5-0.5b_gsm8k   # every kept checkpoint of a run
#   bash scripts/eval.sh --api-url http://127.0.0.1:8000/v1 --api-model NAME ...
#   bash scripts/eval.sh --help        # every flag
#
# Knobs (environment): EVAL_PYTHON (default <repo>/.venv-eval/bin/python; build it with
# `bash scripts/setup.sh --eval`), VLLM_BIN (default <repo>/.venv/bin/vllm), VLLM_ARGS (extra
# `vllm serve` arguments), HF_HUB_OFFLINE / HF_DATASETS_OFFLINE (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EVAL_PYTHON=${EVAL_PYTHON:-$ROOT/.venv-eval/bin/python}
export VLLM_BIN=${VLLM_BIN:-$ROOT/.venv/bin/vllm}
export TRANSFORMERS_NO_ADVISORY_WARNINGS=${TRANSFORMERS_NO_ADVISORY_WARNINGS:-1}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}

if [[ ! -x "$EVAL_PYTHON" ]]; then
  echo "eval.sh: no EvalScope environment at $EVAL_PYTHON (build it: bash scripts/setup.sh --eval)" >&2
  exit 2
fi

# exec: the driver receives signals directly and stops any server it started (finally blocks).
exec "$EVAL_PYTHON" -m verl_gsm8k.evaluate "$@"
