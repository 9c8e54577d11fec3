# shellcheck shell=bash
# Shared launcher logic, sourced by every recipe in this folder (never run directly).
#
# A recipe sets CONFIG_NAME (a file of configs/), RECIPE, its own knob defaults and any
# RECIPE_OVERRIDES, sources this file, then calls `launch "$@"`. This file:
#   1. fills in every knob not yet set, each from the environment first (VAR=${VAR:-default});
#   2. maps the knobs onto verl 0.9.1 keys, once (OVERRIDES);
#   3. checks every knob's type and range (scripts/knobs.py), then runs the preflight
#      (scripts/preflight.py) on the final override list;
#   4. DRY_RUN=1: prints verl's own composed config (`--cfg job`) and exits 0, no GPU needed;
#      otherwise launches `python3 -m verl.trainer.main_ppo` with the user's arguments last.
# Secrets (WANDB_API_KEY, HF_TOKEN, ...) are read by the libraries from the environment and are
# never echoed here.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi

# ---- knobs: model and hardware ----
MODEL_PATH=${MODEL_PATH:?each recipe sets its default model}
CRITIC_MODEL_PATH=${CRITIC_MODEL_PATH:-$MODEL_PATH}   # the critic starts from the same weights
NNODES=${NNODES:-1}
NDEVICES_PER_NODE=${NDEVICES_PER_NODE:-1}

# ---- knobs: batch, lengths, optimisation ----
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-128}             # prompts per step
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-64}        # prompts per gradient update
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-512}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-256}
ACTOR_LR=${ACTOR_LR:-1e-6}
CRITIC_LR=${CRITIC_LR:-1e-5}
KL_COEF=${KL_COEF:-0.001}                             # KL in reward (PPO) or KL loss (GRPO)

# ---- knobs: rollout (vLLM) ----
ROLLOUT_TP=${ROLLOUT_TP:-1}
ROLLOUT_GPU_MEM_UTIL=${ROLLOUT_GPU_MEM_UTIL:-0.4}
ROLLOUT_N=${ROLLOUT_N:-1}

# ---- knobs: schedule ----
TOTAL_EPOCHS=${TOTAL_EPOCHS:-20}
TOTAL_TRAINING_STEPS=${TOTAL_TRAINING_STEPS:-null}    # null: run TOTAL_EPOCHS
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-5}
MAX_CKPT_TO_KEEP=${MAX_CKPT_TO_KEEP:-3}

# ---- knobs: data and reward ----
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
GSM8K_TRAIN_FILE=${GSM8K_TRAIN_FILE:-$DATA_DIR/train.parquet}
GSM8K_TEST_FILE=${GSM8K_TEST_FILE:-$DATA_DIR/test.parquet}
REWARD_FILE=${REWARD_FILE:-$ROOT/rewards/gsm8k.py}
REWARD_FN=${REWARD_FN:-compute_score}

# ---- knobs: run directory and logging ----
PROJECT_NAME=${PROJECT_NAME:-verl_gsm8k}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-$RECIPE}           # same name again = resume that run
RUNS_ROOT=${RUNS_ROOT:-$ROOT/runs}
RUN_DIR=${RUN_DIR:-$RUNS_ROOT/$EXPERIMENT_NAME}       # checkpoints, metrics, logs, generations
if [[ -z "${LOGGER:-}" ]]; then
  LOGGER=console,file
  if [[ -n "${WANDB_API_KEY:-}" ]]; then LOGGER=$LOGGER,wandb; fi
fi

# Ray workers do not share the launch directory: make every local path absolute.
absolute() { if [[ "$1" == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
# A model path may be a hub id (org/name): only an existing local path is made absolute.
local_or_hub() { if [[ -e "$1" ]]; then absolute "$1"; else echo "$1"; fi; }
MODEL_PATH=$(local_or_hub "$MODEL_PATH")
CRITIC_MODEL_PATH=$(local_or_hub "$CRITIC_MODEL_PATH")
GSM8K_TRAIN_FILE=$(absolute "$GSM8K_TRAIN_FILE")
GSM8K_TEST_FILE=$(absolute "$GSM8K_TEST_FILE")
REWARD_FILE=$(absolute "$REWARD_FILE")
RUN_DIR=$(absolute "$RUN_DIR")

# ---- knobs: launcher behaviour ----
DRY_RUN=${DRY_RUN:-0}                                 # 1: preflight + composed config, no training
SKIP_PREFLIGHT=${SKIP_PREFLIGHT:-0}

declare -p RECIPE_OVERRIDES >/dev/null 2>&1 || RECIPE_OVERRIDES=()

# A value as a quoted Hydra string, read back verbatim: quotes, spaces, commas, '=' all survive.
# In Hydra's quoted strings \' is a quote, and backslashes are doubled only before a quote
# (or the closing one); every path-valued override goes through here.
hydra_quote() {
  local value=$1 out="" slashes="" char i
  for ((i = 0; i < ${#value}; i++)); do
    char=${value:i:1}
    if [[ "$char" == "\\" ]]; then slashes+=$char; continue; fi
    if [[ "$char" == "'" ]]; then out+="$slashes$slashes\\'"; else out+="$slashes$char"; fi
    slashes=""
  done
  printf "'%s'" "$out$slashes$slashes"
}

OVERRIDES=(
  "actor_rollout_ref.model.path=$(hydra_quote "$MODEL_PATH")"
  "critic.model.path=$(hydra_quote "$CRITIC_MODEL_PATH")"
  "trainer.nnodes=$NNODES"
  "trainer.n_gpus_per_node=$NDEVICES_PER_NODE"
  "data.train_batch_size=$TRAIN_BATCH_SIZE"
  "actor_rollout_ref.actor.ppo_mini_batch_size=$PPO_MINI_BATCH_SIZE"
  "data.max_prompt_length=$MAX_PROMPT_LENGTH"
  "data.max_response_length=$MAX_RESPONSE_LENGTH"
  "actor_rollout_ref.actor.optim.lr=$ACTOR_LR"
  "critic.optim.lr=$CRITIC_LR"
  "algorithm.kl_ctrl.kl_coef=$KL_COEF"
  "actor_rollout_ref.actor.kl_loss_coef=$KL_COEF"
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP"
  "actor_rollout_ref.rollout.gpu_memory_utilization=$ROLLOUT_GPU_MEM_UTIL"
  "actor_rollout_ref.rollout.n=$ROLLOUT_N"
  "trainer.total_epochs=$TOTAL_EPOCHS"
  "trainer.total_training_steps=$TOTAL_TRAINING_STEPS"
  "trainer.save_freq=$SAVE_FREQ"
  "trainer.test_freq=$TEST_FREQ"
  "trainer.max_actor_ckpt_to_keep=$MAX_CKPT_TO_KEEP"
  "trainer.max_critic_ckpt_to_keep=$MAX_CKPT_TO_KEEP"
  "data.train_files=[$(hydra_quote "$GSM8K_TRAIN_FILE")]"
  "data.val_files=[$(hydra_quote "$GSM8K_TEST_FILE")]"
  "reward.custom_reward_function.path=$(hydra_quote "$REWARD_FILE")"
  "reward.custom_reward_function.name=$REWARD_FN"
  "trainer.project_name=$(hydra_quote "$PROJECT_NAME")"
  "trainer.experiment_name=$(hydra_quote "$EXPERIMENT_NAME")"
  "trainer.default_local_dir=$(hydra_quote "$RUN_DIR")"
  "trainer.rollout_data_dir=$(hydra_quote "$RUN_DIR/rollouts")"
  "trainer.validation_data_dir=$(hydra_quote "$RUN_DIR/validation")"
  "trainer.logger=[$LOGGER]"
)

# Every knob of scripts/knobs.py's table that is set here gets its type and range checked, in
# well under a second, before the slow preflight: one line per bad value, exit 2.
check_knobs() {
  local name values=()
  for name in $("$PYTHON" "$ROOT/scripts/knobs.py" --names); do
    if [[ -n "${!name+set}" ]]; then values+=("$name=${!name}"); fi
  done
  "$PYTHON" "$ROOT/scripts/knobs.py" "${values[@]}"
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

# verl's entry point with our config: main_ppo [hydra flags] -- [user overrides, which go last].
main_ppo() {
  local flags=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do flags+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  "$PYTHON" -m verl.trainer.main_ppo --config-path "$ROOT/configs" --config-name "$CONFIG_NAME" \
    "${flags[@]}" "${OVERRIDES[@]}" "${RECIPE_OVERRIDES[@]}" "$@"
}

launch() {
  if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    echo "usage: [KNOB=value ...] bash recipes/$RECIPE.sh [verl.key=value ...]"
    echo "Knobs and their verl keys: README.md (Knobs). Extra key=value arguments override everything."
    echo "DRY_RUN=1 runs the preflight and prints the final config without a GPU."
    return 0
  fi
  check_knobs || exit $?
  echo "recipe: $RECIPE | config: configs/$CONFIG_NAME.yaml | model: $MODEL_PATH | run dir: $RUN_DIR"
  if [[ "$SKIP_PREFLIGHT" != 1 ]]; then
    "$PYTHON" "$ROOT/scripts/preflight.py" --config-name "$CONFIG_NAME" -- \
      "${OVERRIDES[@]}" "${RECIPE_OVERRIDES[@]}" "$@" || exit $?
  fi
  if [[ "$DRY_RUN" == 1 ]]; then
    main_ppo --cfg job -- "$@"
    return $?
  fi
  if ! has_gpu; then
    echo "recipe: preflight passed, but no NVIDIA GPU is visible here and verl cannot train on CPU; DRY_RUN=1 prints the final config instead." >&2
    exit 3
  fi
  local stamp
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  mkdir -p "$RUN_DIR/metrics" "$RUN_DIR/logs"
  # verl's file logger truncates its file on open: one file per launch keeps a resumed run's history.
  export VERL_FILE_LOGGER_PATH="$RUN_DIR/metrics/metrics-$stamp.jsonl"
  echo "recipe: metrics -> $VERL_FILE_LOGGER_PATH | console log -> $RUN_DIR/logs/console-$stamp.log"
  set +e
  main_ppo -- "$@" 2>&1 | tee "$RUN_DIR/logs/console-$stamp.log"
  local status=${PIPESTATUS[0]}
  set -e
  echo "recipe: verl exited with $status. Report: python scripts/report.py $RUN_DIR"
  exit "$status"
}
