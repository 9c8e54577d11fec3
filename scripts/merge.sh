#!/usr/bin/env bash
# Merge a verl FSDP checkpoint into a Hugging Face model directory with verl's own merger, prove
# it, and write merge_manifest.json beside it: python -m verl_gsm8k.merge (verl_gsm8k/merge/).
#
#   bash scripts/merge.sh SOURCE TARGET_DIR [--force] [--critic] [--best] [--lora-alpha A]
#
# --help says every flag. Exit 0 merged; 2 a missing, partial, corrupt or refused checkpoint, or
# an existing target (nothing written); 1 other errors; 143/130 on SIGTERM/SIGINT. Environment:
# PYTHON (default <repo>/.venv/bin/python, else python3), HF_HUB_OFFLINE (default 1).
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
