#!/usr/bin/env bash
# Merge a verl FSDP checkpoint into a Hugging Face model directory (verl's own merger), verify it
# loads and runs, and write merge_manifest.json beside it. The logic is
# verl_gsm8k/merge/checkpoint.py (python -m verl_gsm8k.merge; its command line: merge/cli.py).
#
#   bash scripts/merge.sh SOURCE TARGET_DIR [--force] [--critic] [--best] [--lora-alpha A]
#
#   SOURCE      a run dir (its tracker picks the step directory), one step directory, or a role
#               dir (actor/ or critic/ of a step directory); an SFT run's step directory holds its
#               one model directly (no actor/): merged as an "SFT model", a causal LM the PPO
#               recipes take as MODEL_PATH. The names: --help, or verl_gsm8k/common/run_dir.py
#   TARGET_DIR  the model directory to create; written beside itself first, renamed when verified
#   --force     replace an existing TARGET_DIR (the old one is removed only after success)
#   --critic    merge the critic (value model) instead of the actor
#   --best      merge the run's kept best checkpoint: the step its best_checkpoint.json names
#               (KEEP_BEST=1); SOURCE is the run dir. No such file, or its step gone: one line, exit 2
#   --lora-alpha  a LoRA checkpoint's alpha when it lacks lora_train_meta.json (a LoRA adapter is
#               always folded into the weights, W + B·A·alpha/r, and recorded in the manifest)
#   --help      show the full help
#
# Exit 0 merged; 2 missing/partial/corrupt checkpoint or existing target (nothing written);
# 1 other error; 143/130 stopped by SIGTERM/SIGINT (the merger stopped too, nothing left behind).
# Knobs (environment): PYTHON (default <repo>/.venv/bin/python, else python3), HF_HUB_OFFLINE
# (default 1: merging never needs the hub).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -x "$ROOT/.venv/bin/python" ]]; then
  PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
else
  PYTHON=${PYTHON:-python3}
fi
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TRANSFORMERS_NO_ADVISORY_WARNINGS=${TRANSFORMERS_NO_ADVISORY_WARNINGS:-1}

exec "$PYTHON" -m verl_gsm8k.merge --python "$PYTHON" "$@"
