#!/usr/bin/env bash
# Does the loop LEARN? On a CPU, in minutes, with no setting: a warm-started tiny model gets better
# at a toy task in GSM8K's format under PPO (actor + critic, GAE) or any algorithm of
# docs/algorithms.md, each with its own config (configs/gsm8k_<ALGO>.yaml):
#   ALGO=ppo bash recipes/learn_tiny.sh                     # PPO: critic, GAE (the default)
#   ALGO=grpo bash recipes/learn_tiny.sh                    # GRPO: group baseline, no critic
#   ALGO=rloo bash recipes/learn_tiny.sh                    # RLOO: leave-one-out baseline
#   ALGO=reinforce_pp bash recipes/learn_tiny.sh            # REINFORCE++: batch-whitened returns
#   ALGO=reinforce_pp_baseline bash recipes/learn_tiny.sh   # REINFORCE++ with a group baseline
#   ALGO=remax bash recipes/learn_tiny.sh                   # ReMax: greedy baseline (legacy trainer)
#   ALGO=drgrpo bash recipes/learn_tiny.sh                  # Dr. GRPO: no std, constant-length loss
#   ALGO=dapo bash recipes/learn_tiny.sh                    # DAPO: clip-higher, dynamic sampling
#   ALGO=gspo bash recipes/learn_tiny.sh                    # GSPO: sequence-level ratio and clip
# Every algorithm keeps this recipe's toy settings (group of ROLLOUT_N=8 where it has groups);
# DAPO's overlong buffer is a fifth of the toy's response length, as the paper's is of its own.
# First use builds, and caches under CACHE_DIR/learn-tiny/v2[/hard]/seed$SEED:
#   1. the tiny random Qwen2 (python -m verl_gsm8k.common.tiny_model, offline);
#   2. the toy task: single-digit sums in GSM8K's format (python -m data_prep.arithmetic), then
#      verl's RL parquet through the real path (python -m data_prep.gsm8k);
#   3. the warm start: verl's SFT trainer (recipes/sft_qwen2.5-0.5b_gsm8k.sh) on demonstrations that
#      end with the "#### N" line the reward reads in only part of the answers (a habit of the
#      question's writer: docs/learning.md), its last step (WARM_START_ACC=last) or its first save
#      whose greedy accuracy on the toy test split is in a band (WARM_START_ACC=LOW-HIGH: python -m
#      verl_gsm8k.warm_start), merged to a Hugging Face model (scripts/merge.sh).
# Then the RL run starts from the warm start; at its end the report (python -m verl_gsm8k.report)
# prints validation accuracy (greedy, the toy test split) at step 0 and at the last step.
# These settings fit a 0.37M-parameter model on a toy task, NOT Qwen2.5 on GSM8K: recipes/README.md.
# Every knob is an environment variable (docs/guide.md, Knobs); key=value arguments win over all.
set -euo pipefail

ALGO=${ALGO:-ppo}                         # one of the names above (verl_gsm8k/preflight/knobs.py)
CONFIG_NAME=gsm8k_$ALGO
if [[ ! -f "$(dirname "${BASH_SOURCE[0]}")/../configs/$CONFIG_NAME.yaml" ]]; then
  CONFIG_NAME=gsm8k_ppo                   # check_knobs stops the launch with one line
fi
RECIPE=learn_tiny
CPU_BY_DEFAULT=1                          # no GPU: train on the CPU instead of stopping
SEED=${SEED:-0}                           # toy data, warm start and RL data order
# easy: sums up to 4 + 4 and a converged warm start (every algorithm reaches ~1.00: does it learn?);
# hard: sums up to 9 + 9 and a warm start stopped when its accuracy first reaches 0.30-0.45, which
# knows part of them (nothing reaches 1.00 in 20 steps: which learns best? bench.algorithms).
TOY_TASK=${TOY_TASK:-easy}
if [[ "$TOY_TASK" == hard ]]; then
  TOY_MAX_OPERAND=9; WARM_START_DEFAULT=300; WARM_START_ACC_DEFAULT=0.30-0.45; TOY_CACHE=hard/
else  # check_knobs refuses a name not easy or hard
  TOY_MAX_OPERAND=4; WARM_START_DEFAULT=400; WARM_START_ACC_DEFAULT=last; TOY_CACHE=""
fi
WARM_START_STEPS=${WARM_START_STEPS:-$WARM_START_DEFAULT}  # SFT steps of the warm start (at most)
WARM_START_ACC=${WARM_START_ACC:-$WARM_START_ACC_DEFAULT}  # last, or the band of a save to stop at
WARM_START_SAVE_EVERY=10                # SFT steps between the saves scored for WARM_START_ACC
EXPERIMENT_NAME=${EXPERIMENT_NAME:-learn_tiny_${ALGO}_$(date -u +%Y%m%dT%H%M%SZ)}  # a fresh run each time
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-16}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-8}
ROLLOUT_N=${ROLLOUT_N:-8}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-128}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-24}
ACTOR_LR=${ACTOR_LR:-3e-4}
CRITIC_LR=${CRITIC_LR:-1e-3}
TOTAL_TRAINING_STEPS=${TOTAL_TRAINING_STEPS:-20}
TEST_FREQ=${TEST_FREQ:-5}
SAVE_FREQ=${SAVE_FREQ:-10}              # steps 10 and 20: the last to merge, both to sweep
KEEP_BEST=${KEEP_BEST:-0}               # no extra save of a best step 5 or 15: the sweep sees 10, 20
# The actor's learning rate decays (cosine, to a tenth by the last step): the format is learned in
# the first ~10 steps, and full-size updates after that only wear down what the warm start knew
# (docs/learning.md, "Why sums were lost").
RECIPE_OVERRIDES=("data.seed=$SEED" actor_rollout_ref.actor.optim.lr_scheduler_type=cosine
                  actor_rollout_ref.actor.optim.min_lr_ratio=0.1)
if [[ "$ALGO" == dapo ]]; then
  RECIPE_OVERRIDES+=("reward.reward_kwargs.overlong_buffer_cfg.len=$((MAX_RESPONSE_LENGTH / 5))")
fi

# The warm start's SFT run: the toy demonstrations, 32 per step, a cosine learning rate from 3e-3
# down to 3e-4, so it ends converged: every sum learned, on the computation line and on the marker
# line alike (docs/learning.md, "Why sums were lost").
WARM_START_LR=3e-3
WARM_START_BATCH=32
# Bump when the toy task or the warm start's recipe changes: a cache of an older one is not reused.
LEARN_CACHE_VERSION=2

recipe_defaults() {
  LEARN_HOME=$CACHE_DIR/learn-tiny/v$LEARN_CACHE_VERSION/${TOY_CACHE}seed$SEED
  if [[ "$LEARN_HOME" != /* ]]; then LEARN_HOME=$PWD/$LEARN_HOME; fi  # Ray workers: absolute paths
  TOY_DIR=$LEARN_HOME/data
  WARM_START_DIR=$LEARN_HOME/warm-start-$WARM_START_STEPS
  if [[ "$WARM_START_ACC" != last ]]; then WARM_START_DIR+=-acc$WARM_START_ACC; fi
  MODEL_PATH=${MODEL_PATH:-$WARM_START_DIR}
  DATA_DIR=${DATA_DIR:-$TOY_DIR/rl}
}

# The SFT recipe runs as a child with none of this run's knobs (they are the RL run's).
warm_start_env() {
  local name unset=()
  for name in $("$PYTHON" -m verl_gsm8k.preflight.knobs --names) "${PATH_KNOBS[@]}" \
      VERL_USE_EXTERNAL_MODULES; do
    unset+=(-u "$name")
  done
  echo "${unset[@]}"
}

prepare_run() {
  local need_warm=0
  if [[ "$MODEL_PATH" == "$WARM_START_DIR" && ! -e "$MODEL_PATH/config.json" ]]; then need_warm=1; fi
  if [[ "$need_warm" == 1 || "$DATA_DIR" == "$TOY_DIR/rl" ]] && [[ ! -e "$TOY_DIR/rl/test.parquet" ]]; then
    echo "recipe: the toy task ($TOY_TASK: sums up to $TOY_MAX_OPERAND + $TOY_MAX_OPERAND in GSM8K's format, seed $SEED) -> $TOY_DIR"
    "$PYTHON" -m data_prep.arithmetic --out-dir "$TOY_DIR" --seed "$SEED" \
      --max-operand "$TOY_MAX_OPERAND" >/dev/null
    "$PYTHON" -m data_prep.gsm8k --source "$TOY_DIR" --out-dir "$TOY_DIR/rl" >/dev/null
  fi
  [[ "$need_warm" == 1 ]] || return 0
  if [[ ! -e "$TINY_MODEL_DIR/config.json" ]]; then
    echo "recipe: building the tiny random Qwen2 (offline, once) -> $TINY_MODEL_DIR"
    "$PYTHON" -m verl_gsm8k.common.tiny_model "$TINY_MODEL_DIR" --force >/dev/null
  fi
  local sft_run=$LEARN_HOME/warm-start-run log=$LEARN_HOME/warm-start.log device=cpu picked
  if [[ "$TRAIN_ON" == gpu ]]; then device=gpu; fi
  # The band: a save every WARM_START_SAVE_EVERY steps, each with its Hugging Face copy to score.
  local save_every=$WARM_START_STEPS keep=3 contents='[model,optimizer,extra]'
  if [[ "$WARM_START_ACC" != last ]]; then
    save_every=$WARM_START_SAVE_EVERY keep=null contents='[model,hf_model]'
  fi
  echo "recipe: warm start (once): up to $WARM_START_STEPS steps of verl's SFT trainer on the toy demonstrations, WARM_START_ACC=$WARM_START_ACC -> $MODEL_PATH (log: $log)"
  # A build killed mid-merge leaves merge.sh's temporary copy beside the model (a hidden
  # .NAME.merging-* of a model's size): this build replaces it.
  rm -rf "$sft_run" "$(dirname "$MODEL_PATH")/.$(basename "$MODEL_PATH")".merging-*
  # shellcheck disable=SC2046  # one word per `env -u NAME`
  if ! env $(warm_start_env) DEVICE=$device DRY_RUN=0 MODEL_PATH="$TINY_MODEL_DIR" \
      SFT_TRAIN_FILE="$TOY_DIR/warm_start/train.parquet" SFT_TEST_FILE="$TOY_DIR/warm_start/test.parquet" \
      TOTAL_TRAINING_STEPS="$WARM_START_STEPS" SAVE_FREQ="$save_every" TEST_FREQ="$WARM_START_STEPS" \
      MAX_CKPT_TO_KEEP=$keep SFT_LR=$WARM_START_LR TRAIN_BATCH_SIZE=$WARM_START_BATCH MAX_LENGTH=160 \
      LOGGER=console,file RUN_DIR="$sft_run" bash "$ROOT/recipes/sft_qwen2.5-0.5b_gsm8k.sh" \
      optim.lr_scheduler_type=cosine optim.min_lr_ratio=0.1 optim.lr_warmup_steps_ratio=0 \
      "checkpoint.save_contents=$contents" "trainer.seed=$SEED" >"$log" 2>&1; then
    echo "recipe: the warm start's SFT run failed; its log: $log" >&2
    exit 1
  fi
  picked=$sft_run
  if [[ "$WARM_START_ACC" != last ]]; then
    picked=$("$PYTHON" -m verl_gsm8k.warm_start "$sft_run" --test-file "$TOY_DIR/rl/test.parquet" \
      --band "$WARM_START_ACC" --max-new-tokens "$MAX_RESPONSE_LENGTH" \
      --record "$WARM_START_DIR.pick.json" 2>>"$log") ||
      { echo "recipe: scoring the warm start's saves failed; its log: $log" >&2; exit 1; }
    echo "recipe: $(tail -n 1 "$log") (the scores: $WARM_START_DIR.pick.json)"
  fi
  PYTHON=$PYTHON bash "$ROOT/scripts/merge.sh" "$picked" "$MODEL_PATH" --force >>"$log" 2>&1 ||
    { echo "recipe: merging the warm start failed; its log: $log" >&2; exit 1; }
  rm -rf "$sft_run"
}

after_run() {
  [[ "$1" == 0 ]] || return 0
  echo "recipe: step 0 is the warm start; the report below reads its validation accuracy (greedy, toy test split) and the last step's"
  "$PYTHON" -m verl_gsm8k.report "$RUN_DIR" || echo "recipe: the report failed (python -m verl_gsm8k.report $RUN_DIR)" >&2
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "$@"
