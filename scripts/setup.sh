#!/usr/bin/env bash
# Build the project environments from scratch; safe to re-run (pip skips what is already there).
#
#   bash scripts/setup.sh           # .venv: training stack on a GPU machine, CPU dev stack otherwise
#   bash scripts/setup.sh --eval    # .venv-eval: EvalScope, kept apart from verl's Hydra
#
# Knobs (environment): PYTHON (interpreter, default python3), VENV_DIR (default .venv),
# EVAL_VENV_DIR (default .venv-eval), FORCE_CPU=1 (CPU stack even where a GPU is visible).
# Every version pin lives in pyproject.toml; this script only chooses which extras to install.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
VENV_DIR=${VENV_DIR:-$ROOT/.venv}
EVAL_VENV_DIR=${EVAL_VENV_DIR:-$ROOT/.venv-eval}
FORCE_CPU=${FORCE_CPU:-0}

target=main
case "${1:-}" in
  "") ;;
  --eval) target="eval" ;;
  -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup.sh: unknown argument '$1' (use --eval or --help)" >&2; exit 2 ;;
esac

start=$(date +%s)

# The one pin of a package inside an extra of pyproject.toml, e.g. pin torch -> "torch==2.13.0".
pin() {
  local spec
  spec=$(grep -oE "\"$1(\[[^]]*\])?==[^\"]+\"" "$ROOT/pyproject.toml" | head -n 1 | tr -d '"')
  [[ -n "$spec" ]] || { echo "setup.sh: no pin for '$1' in pyproject.toml" >&2; exit 1; }
  echo "$spec"
}

has_gpu() {
  [[ "$FORCE_CPU" != 1 ]] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

make_venv() {
  local dir=$1
  if [[ ! -x "$dir/bin/python" ]]; then
    echo "==> creating $dir with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$dir"
  else
    echo "==> reusing $dir"
  fi
  "$dir/bin/python" -m pip install --quiet --upgrade pip
}

pip_in() { local dir=$1; shift; "$dir/bin/python" -m pip install --quiet "$@"; }
# The project itself is installed editable, so `python -m data_prep.gsm8k` works from anywhere.
pip_project() { pip_in "$1" -e "${ROOT}[$2]"; }

report() {
  local dir=$1; shift
  echo "==> installed in $dir:"
  "$dir/bin/python" -m pip list --format=freeze 2>/dev/null | grep -iE "^($(IFS='|'; echo "$*"))==" | sed 's/^/    /' || true
  echo "==> done in $(( $(date +%s) - start )) s"
}

if [[ "$target" == eval ]]; then
  make_venv "$EVAL_VENV_DIR"
  if has_gpu; then
    # On a GPU the model is served by vLLM from .venv; EvalScope only talks to it over HTTP.
    pip_project "$EVAL_VENV_DIR" eval
  else
    pip_in "$EVAL_VENV_DIR" "$(pin torch)"
    pip_project "$EVAL_VENV_DIR" eval,eval-local
  fi
  report "$EVAL_VENV_DIR" evalscope transformers torch accelerate antlr4-python3-runtime
  exit 0
fi

make_venv "$VENV_DIR"
if has_gpu; then
  echo "==> NVIDIA GPU found: installing the training stack (verl + vLLM)"
  pip_project "$VENV_DIR" gpu,dev
  # flash-attn: only a prebuilt wheel, never a source build (that needs a CUDA toolkit and an hour).
  if ! pip_in "$VENV_DIR" --only-binary=:all: "$(pin flash-attn)" 2>/dev/null; then
    echo "==> notice: no prebuilt $(pin flash-attn) wheel for this Python/torch; continuing without it (verl falls back to PyTorch attention)."
  fi
else
  echo "==> no NVIDIA GPU: installing the CPU development stack (torch CPU build first, no CUDA)"
  pip_in "$VENV_DIR" "$(pin torch)"
  pip_project "$VENV_DIR" cpu,dev
fi
report "$VENV_DIR" verl torch transformers vllm flash-attn ray hydra-core ruff pytest
