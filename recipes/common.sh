# shellcheck shell=bash
# Shared launcher logic, sourced by every recipe in this folder (never run directly).
#
# A recipe sets CONFIG_NAME (a file of configs/), RECIPE, TRAINER (ppo, the default, or sft), its
# own knob defaults and any RECIPE_OVERRIDES, sources this file, then calls `launch "$@"`.
# A recipe may also define three hooks (recipes/learn_tiny.sh does):
#   recipe_defaults   called once CACHE_DIR is known, before the knobs below take their defaults;
#   prepare_run       called by launch after the knob checks, before the preflight (builds inputs);
#   after_run STATUS  called by launch once verl has exited (prints what the run showed).
# TRAINER picks verl's entry point, the knobs that apply and their keys, and the config overlays:
#   ppo  python -m verl.trainer.main_ppo (Ray starts the workers), configs over ppo_trainer.yaml;
#   sft  torchrun -m verl.trainer.sft_trainer (one process per device), configs over
#        sft_trainer_engine.yaml.
# This file:
#   1. fills in every knob not yet set, each from the environment first (VAR=${VAR:-default});
#   2. maps the knobs onto verl 0.9.1 keys, once (OVERRIDES);
#   3. checks every knob's type and range (verl_gsm8k/preflight/knobs.py), then runs the preflight
#      (python -m verl_gsm8k.preflight --trainer $TRAINER) on the final override list;
#   4. DRY_RUN=1: prints verl's own composed config (`--cfg job`) and exits 0, no GPU needed;
#      otherwise launches verl's entry point with the user's arguments last.
# Secrets (WANDB_API_KEY, HF_TOKEN, ...) are read by the libraries from the environment and are
# never echoed here.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
# DEVICE=gpu on a Ray cluster (RAY_ADDRESS; PPO: main_ppo runs its workers through Ray): the GPUs
# are the cluster's, and the launching node (a KubeRay head, a `ray job submit` entrypoint) may
# have none. The preflight counts the cluster's GPUs instead (ray.nodes()).
on_ray_cluster() { [[ -n "${RAY_ADDRESS:-}" && "$TRAINER" == ppo && "$TRAIN_ON" == gpu ]]; }

# ---- which verl trainer (set by the recipe) ----
TRAINER=${TRAINER:-ppo}
# The knobs only one trainer reads: set for the other one, they are ignored, and said so.
PPO_KNOBS=(CRITIC_MODEL_PATH PPO_MINI_BATCH_SIZE MAX_PROMPT_LENGTH MAX_RESPONSE_LENGTH ACTOR_LR
           CRITIC_LR KL_COEF ROLLOUT_TP ROLLOUT_GPU_MEM_UTIL ROLLOUT_N GSM8K_TRAIN_FILE
           GSM8K_TEST_FILE REWARD_FILE REWARD_FN TRACE_SAMPLES)
SFT_KNOBS=(SFT_LR MAX_LENGTH SFT_TRAIN_FILE SFT_TEST_FILE)
# The knobs that name paths and runs (every other knob is in verl_gsm8k/preflight/knobs.py's table).
PATH_KNOBS=(MODEL_PATH CRITIC_MODEL_PATH DATA_DIR GSM8K_TRAIN_FILE GSM8K_TEST_FILE SFT_TRAIN_FILE
            SFT_TEST_FILE REWARD_FILE PROJECT_NAME EXPERIMENT_NAME RUNS_ROOT RUN_DIR CACHE_DIR)
case "$TRAINER" in
  ppo) OTHER_KNOBS=("${SFT_KNOBS[@]}"); TRAINER_LABEL=PPO; OVERLAY_SUFFIX="" ;;
  sft) OTHER_KNOBS=("${PPO_KNOBS[@]}"); TRAINER_LABEL=SFT; OVERLAY_SUFFIX=_sft ;;
  *) echo "recipe: TRAINER=$TRAINER is not ppo or sft (set by the recipe)" >&2; exit 2 ;;
esac
IGNORED_KNOBS=()
for name in "${OTHER_KNOBS[@]}"; do
  if [[ -n "${!name:-}" ]]; then IGNORED_KNOBS+=("$name"); fi
done

# ---- knob: device (auto: a GPU when nvidia-smi lists one) ----
# Without a GPU, auto trains on the CPU only in recipes that set CPU_BY_DEFAULT=1 (smoke_tiny);
# the others need DEVICE=cpu, and otherwise stop after the preflight (TRAIN_ON=none).
DEVICE=${DEVICE:-auto}
case "$DEVICE" in
  gpu|cpu) TRAIN_ON=$DEVICE ;;
  auto)
    if has_gpu; then TRAIN_ON=gpu
    elif [[ "${CPU_BY_DEFAULT:-0}" == 1 ]]; then TRAIN_ON=cpu
    else TRAIN_ON=none
    fi ;;
  *) TRAIN_ON=none ;;  # check_knobs (verl_gsm8k/preflight/knobs.py) stops the launch with one line
esac

# Where the CPU path keeps what it builds on first use (the tiny model, the prepared sample data).
CACHE_DIR=${CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/verl-gsm8k}
TINY_MODEL_DIR=$CACHE_DIR/tiny-qwen2
if declare -F recipe_defaults >/dev/null; then recipe_defaults; fi

# ---- knobs: model and hardware ----
# On a CPU the default model is a tiny random Qwen2 built offline on first use (never the hub).
if [[ "$TRAIN_ON" == cpu ]]; then DEFAULT_MODEL_PATH=$TINY_MODEL_DIR; fi
MODEL_PATH=${MODEL_PATH:-$DEFAULT_MODEL_PATH}
NNODES=${NNODES:-1}
NDEVICES_PER_NODE=${NDEVICES_PER_NODE:-1}

# ---- knobs: batch (PPO: prompts per step; SFT: examples per optimizer step) ----
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-128}

if [[ "$TRAINER" == ppo ]]; then
  CRITIC_MODEL_PATH=${CRITIC_MODEL_PATH:-$MODEL_PATH}   # the critic starts from the same weights
  # ---- knobs: batch, lengths, optimisation ----
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
  # ---- knob: the per-token trace of a few responses per step (RUN_DIR/trace/; 0 = off) ----
  TRACE_SAMPLES=${TRACE_SAMPLES:-4}
  # ---- knobs: the run's guard (verl_gsm8k/guard/, docs/reliability.md) ----
  WATCHDOG=${WATCHDOG:-stop}                # stop | warn | off: a sick step (NaN, KL blow-up...)
  KEEP_BEST=${KEEP_BEST:-1}                 # keep the checkpoint of the best validation score
  BEST_METRIC=${BEST_METRIC:-val-core/openai/gsm8k/acc/mean@1}
else
  # ---- knobs: SFT lengths and optimisation ----
  SFT_LR=${SFT_LR:-1e-5}                                # peak learning rate (cosine schedule)
  MAX_LENGTH=${MAX_LENGTH:-1024}                        # tokens of prompt + answer per example
fi

# ---- knobs: schedule ----
TOTAL_EPOCHS=${TOTAL_EPOCHS:-20}
TOTAL_TRAINING_STEPS=${TOTAL_TRAINING_STEPS:-null}    # null: run TOTAL_EPOCHS
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-5}
MAX_CKPT_TO_KEEP=${MAX_CKPT_TO_KEEP:-3}
STOP_GRACE_SET=${STOP_GRACE_S:+1}   # set by the user: kept under Slurm too (request_stop)
STOP_GRACE_S=${STOP_GRACE_S:-30}   # after SIGTERM: seconds to finish the step and save (unset: chosen from the measured step and save, plan_grace)
LOCK_WAIT_S=${LOCK_WAIT_S:-0}      # another launch trains into RUN_DIR: seconds to wait for it to end

# ---- knobs: data and reward ----
# PPO reads prompts (python -m data_prep.gsm8k), SFT chat transcripts (python -m data_prep.sft).
# With nothing prepared at the default place, CPU runs use the GSM8K sample shipped in data_prep/.
if [[ "$TRAINER" == ppo ]]; then
  DATA_HOME=$HOME/data/gsm8k SAMPLE_DATA_DIR=$CACHE_DIR/gsm8k-sample DATA_PREP=data_prep.gsm8k
  TRAIN_FILE_SET=${GSM8K_TRAIN_FILE:-}
else
  DATA_HOME=$HOME/data/gsm8k-sft SAMPLE_DATA_DIR=$CACHE_DIR/gsm8k-sft-sample DATA_PREP=data_prep.sft
  TRAIN_FILE_SET=${SFT_TRAIN_FILE:-}
fi
if [[ -z "${DATA_DIR:-}$TRAIN_FILE_SET" && "$TRAIN_ON" == cpu && ! -e "$DATA_HOME/train.parquet" ]]; then
  DATA_DIR=$SAMPLE_DATA_DIR
  USE_SAMPLE_DATA=1
fi
DATA_DIR=${DATA_DIR:-$DATA_HOME}
if [[ "$TRAINER" == ppo ]]; then
  GSM8K_TRAIN_FILE=${GSM8K_TRAIN_FILE:-$DATA_DIR/train.parquet}
  GSM8K_TEST_FILE=${GSM8K_TEST_FILE:-$DATA_DIR/test.parquet}
  REWARD_FILE=${REWARD_FILE:-$ROOT/rewards/gsm8k.py}
  REWARD_FN=${REWARD_FN:-compute_score}
  TRAIN_FILE=$GSM8K_TRAIN_FILE TEST_FILE=$GSM8K_TEST_FILE
else
  SFT_TRAIN_FILE=${SFT_TRAIN_FILE:-$DATA_DIR/train.parquet}
  SFT_TEST_FILE=${SFT_TEST_FILE:-$DATA_DIR/test.parquet}
  TRAIN_FILE=$SFT_TRAIN_FILE TEST_FILE=$SFT_TEST_FILE
fi

# ---- knobs: run directory and logging ----
PROJECT_NAME=${PROJECT_NAME:-verl_gsm8k}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-$RECIPE}           # same name again = resume that run
RUNS_ROOT=${RUNS_ROOT:-$ROOT/runs}
RUN_DIR=${RUN_DIR:-$RUNS_ROOT/$EXPERIMENT_NAME}       # checkpoints, metrics, logs, generations
if [[ -z "${LOGGER:-}" ]]; then
  LOGGER=console,file
  if [[ -n "${WANDB_API_KEY:-}" ]]; then LOGGER=$LOGGER,wandb; fi
fi
logs_to_wandb() { [[ ",$LOGGER," == *",wandb,"* ]]; }

# Ray workers do not share the launch directory: make every local path absolute.
absolute() { if [[ "$1" == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
# A model path may be a hub id (org/name): only an existing local path is made absolute.
local_or_hub() { if [[ -e "$1" ]]; then absolute "$1"; else echo "$1"; fi; }
MODEL_PATH=$(local_or_hub "$MODEL_PATH")
TRAIN_FILE=$(absolute "$TRAIN_FILE")
TEST_FILE=$(absolute "$TEST_FILE")
if [[ "$TRAINER" == ppo ]]; then
  CRITIC_MODEL_PATH=$(local_or_hub "$CRITIC_MODEL_PATH")
  GSM8K_TRAIN_FILE=$TRAIN_FILE GSM8K_TEST_FILE=$TEST_FILE
  REWARD_FILE=$(absolute "$REWARD_FILE")
else
  SFT_TRAIN_FILE=$TRAIN_FILE SFT_TEST_FILE=$TEST_FILE
fi
RUN_DIR=$(absolute "$RUN_DIR")
# wandb writes its local run (online or offline) under WANDB_DIR: the run directory by default.
if logs_to_wandb; then export WANDB_DIR=${WANDB_DIR:-$RUN_DIR}; fi

# ---- knobs: launcher behaviour ----
DRY_RUN=${DRY_RUN:-0}                                 # 1: preflight + composed config, no training
SKIP_PREFLIGHT=${SKIP_PREFLIGHT:-0}
# auto: where the recipe's micro-batch token budgets would pass 90 % of this node's card in some
# phase, the preflight picks the largest power of two that fits and says so (PPO/GRPO;
# verl_gsm8k/preflight/budget.py); recipe: keep the recipe's. A *_max_token_len_per_gpu key among
# the launch's own key=value overrides always wins.
TOKEN_BUDGET=${TOKEN_BUDGET:-auto}
# A relaunch into a run dir with a checkpoint: auto resumes it only when the launch that wrote it
# had the same config (every key but the few of docs/resume.md); force resumes it anyway; disable
# starts over (verl_gsm8k/resume/guard.py).
RESUME=${RESUME:-auto}

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

# ---- device and attention settings, from one place: two config overlays and a few variables ----
# configs/attention/sdpa_packed.yaml, sdpa.yaml or fa4.yaml where flash-attn 2 is not used (every
# CPU, GPU machines without its wheel); configs/device/cpu.yaml on a CPU; the SFT trainer's twins
# are attention/*_sft.yaml and device/cpu_sft.yaml (its model keys differ). verl loads our modules (verl_gsm8k/verl_plugins/) in
# every process through its plugin variable, by package path: the project is installed in the venv
# Ray's workers (and torchrun's) run. key=value arguments still win.
DEVICE_OVERRIDES=()
# Every checkpoint file verl loads is checked in the process that loads it, from the handle it
# loads (verl_gsm8k/verl_plugins/checked_load.py): the launcher's check is minutes earlier.
VERL_MODULES=(verl_gsm8k.verl_plugins.checked_load)
# ---- knob: attention (auto: flash-attn 2 where its extension loads, else sdpa with padding
# removal on a GPU, sdpa padded on the CPU; fa2, fa4, sdpa, sdpa_packed ask for one) ----
# verl_gsm8k/common/attention.py decides, the same function the preflight and the fallback plugin
# use (exported, so that verl's processes decide alike). It prints the choice and the one line the
# launch and the preflight print; a request it cannot meet is refused by launch, before anything.
export ATTENTION=${ATTENTION:-auto}
attention_args=(--want "$ATTENTION")
if [[ "$TRAIN_ON" == cpu ]]; then attention_args+=(--cpu); fi
ATTENTION_REFUSAL=""
if attention_out=$("$PYTHON" -m verl_gsm8k.common.attention "${attention_args[@]}" 2>/dev/null); then
  ATTENTION_CHOICE=$(sed -n 1p <<<"$attention_out")
  ATTENTION_LINE=$(sed -n 2p <<<"$attention_out")
else
  ATTENTION_REFUSAL=$(tail -n 1 <<<"$attention_out")
  ATTENTION_REFUSAL=${ATTENTION_REFUSAL:-"attention: the probe $PYTHON -m verl_gsm8k.common.attention failed"}
  ATTENTION_CHOICE=sdpa
  ATTENTION_LINE="refused ($ATTENTION_REFUSAL)"
fi
# fa2 runs verl's own configs; the others add their overlay and the plugin that gives the
# critic (hard-coded flash_attention_2 in verl 0.9.1) the same attention.
if [[ "$ATTENTION_CHOICE" != fa2 ]]; then
  DEVICE_OVERRIDES+=("+attention=$ATTENTION_CHOICE$OVERLAY_SUFFIX")
  VERL_MODULES+=(verl_gsm8k.verl_plugins.attention_fallback)
fi
if [[ "$TRAIN_ON" == cpu ]]; then
  DEVICE_OVERRIDES+=("+device=cpu$OVERLAY_SUFFIX")
  VERL_MODULES+=(verl_gsm8k.verl_plugins.cpu_platform)
  # One compute thread per process: a CPU run's processes share the cores, and torch's default of
  # a thread per core in each (Ray gives its workers one per CPU they hold: several) makes them
  # wait on each other; an SFT step of the tiny model took 2.1 s on 2 threads, 0.32 s on one
  # (docs/cpu.md, "Threads"). On a machine with cores to spare, set OMP_NUM_THREADS yourself.
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  export VERL_PLATFORM=cpu                 # verl's platform registry picks verl_plugins/cpu_platform.py
  export VERL_ENGINE_DEVICE=cuda           # verl registers its FSDP engines for cuda/npu only
  if [[ "$TRAINER" == ppo ]]; then
    export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}              # GiB of KV cache
    export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}  # share the cores
    # Ray starts one idle Python worker per logical CPU in advance: 16 imports competing for 2 cores.
    export RAY_enable_worker_prestart=${RAY_enable_worker_prestart:-0}
    export RAY_prestart_worker_first_driver=${RAY_prestart_worker_first_driver:-0}
  fi
fi
if [[ "$TRAINER" == ppo ]]; then
  VERL_MODULES+=(verl_gsm8k.verl_plugins.register_trainer)  # the PPO trainer (verl_gsm8k/ppo_trainer/)
  VERL_MODULES+=(verl_gsm8k.verl_plugins.stop_on_sigterm)   # SIGTERM to any verl process: a stop request
fi
modules=$(IFS=,; echo "${VERL_MODULES[*]}")
export VERL_USE_EXTERNAL_MODULES=$modules${VERL_USE_EXTERNAL_MODULES:+,$VERL_USE_EXTERNAL_MODULES}
# On a Ray cluster started by hand (RAY_ADDRESS set) the workers of every node were forked from
# `ray start`, not from this shell: the job's runtime environment hands them these variables.
# (The SFT trainer runs no Ray: torchrun starts its processes from this shell.)
if [[ -n "${RAY_ADDRESS:-}" && "$TRAINER" == ppo ]]; then
  DEVICE_OVERRIDES+=("+ray=attach")
  for var in VERL_USE_EXTERNAL_MODULES ATTENTION VERL_PLATFORM VERL_ENGINE_DEVICE \
             VLLM_CPU_KVCACHE_SPACE VLLM_CPU_OMP_THREADS_BIND WANDB_MODE WANDB_DIR; do
    if [[ -n "${!var:-}" ]]; then
      DEVICE_OVERRIDES+=("+ray_kwargs.ray_init.runtime_env.env_vars.$var=$(hydra_quote "${!var}")")
    fi
  done
fi

# ---- every knob onto its verl key, once ----
# knob_key KNOB KEY VALUE appends KEY=VALUE to OVERRIDES and notes that KNOB set KEY (the launch
# record keeps it: the run comparison names the knob beside each key that differs).
OVERRIDES=()
KNOB_KEYS=()
knob_key() { OVERRIDES+=("$2=$3"); KNOB_KEYS+=("$2=$1"); }
if [[ "$TRAINER" == ppo ]]; then
  knob_key MODEL_PATH actor_rollout_ref.model.path "$(hydra_quote "$MODEL_PATH")"
  knob_key CRITIC_MODEL_PATH critic.model.path "$(hydra_quote "$CRITIC_MODEL_PATH")"
  knob_key NNODES trainer.nnodes "$NNODES"
  knob_key NDEVICES_PER_NODE trainer.n_gpus_per_node "$NDEVICES_PER_NODE"
  knob_key TRAIN_BATCH_SIZE data.train_batch_size "$TRAIN_BATCH_SIZE"
  knob_key PPO_MINI_BATCH_SIZE actor_rollout_ref.actor.ppo_mini_batch_size "$PPO_MINI_BATCH_SIZE"
  knob_key MAX_PROMPT_LENGTH data.max_prompt_length "$MAX_PROMPT_LENGTH"
  knob_key MAX_RESPONSE_LENGTH data.max_response_length "$MAX_RESPONSE_LENGTH"
  knob_key ACTOR_LR actor_rollout_ref.actor.optim.lr "$ACTOR_LR"
  knob_key CRITIC_LR critic.optim.lr "$CRITIC_LR"
  knob_key KL_COEF algorithm.kl_ctrl.kl_coef "$KL_COEF"
  knob_key KL_COEF actor_rollout_ref.actor.kl_loss_coef "$KL_COEF"
  knob_key ROLLOUT_TP actor_rollout_ref.rollout.tensor_model_parallel_size "$ROLLOUT_TP"
  knob_key ROLLOUT_GPU_MEM_UTIL actor_rollout_ref.rollout.gpu_memory_utilization "$ROLLOUT_GPU_MEM_UTIL"
  knob_key ROLLOUT_N actor_rollout_ref.rollout.n "$ROLLOUT_N"
  knob_key TOTAL_EPOCHS trainer.total_epochs "$TOTAL_EPOCHS"
  knob_key TOTAL_TRAINING_STEPS trainer.total_training_steps "$TOTAL_TRAINING_STEPS"
  knob_key SAVE_FREQ trainer.save_freq "$SAVE_FREQ"
  knob_key TEST_FREQ trainer.test_freq "$TEST_FREQ"
  knob_key MAX_CKPT_TO_KEEP trainer.max_actor_ckpt_to_keep "$MAX_CKPT_TO_KEEP"
  knob_key MAX_CKPT_TO_KEEP trainer.max_critic_ckpt_to_keep "$MAX_CKPT_TO_KEEP"
  knob_key GSM8K_TRAIN_FILE data.train_files "[$(hydra_quote "$GSM8K_TRAIN_FILE")]"
  knob_key GSM8K_TEST_FILE data.val_files "[$(hydra_quote "$GSM8K_TEST_FILE")]"
  knob_key REWARD_FILE reward.custom_reward_function.path "$(hydra_quote "$REWARD_FILE")"
  knob_key REWARD_FN reward.custom_reward_function.name "$REWARD_FN"
  knob_key PROJECT_NAME trainer.project_name "$(hydra_quote "$PROJECT_NAME")"
  knob_key EXPERIMENT_NAME trainer.experiment_name "$(hydra_quote "$EXPERIMENT_NAME")"
  knob_key RUN_DIR trainer.default_local_dir "$(hydra_quote "$RUN_DIR")"
  knob_key RUN_DIR trainer.rollout_data_dir "$(hydra_quote "$RUN_DIR/rollouts")"
  knob_key RUN_DIR trainer.validation_data_dir "$(hydra_quote "$RUN_DIR/validation")"
  knob_key LOGGER trainer.logger "[$LOGGER]"
  # The recipes' trainer: verl's own sync trainer, guarded and traced, registered under another
  # name (verl_gsm8k/ppo_trainer/).
  OVERRIDES+=(trainer.v1.trainer_mode=gsm8k)
  knob_key TRACE_SAMPLES gsm8k_trace.samples "$TRACE_SAMPLES"
  knob_key WATCHDOG gsm8k_guard.watchdog.mode "$WATCHDOG"
  knob_key KEEP_BEST gsm8k_guard.keep_best "$([[ "$KEEP_BEST" == 1 ]] && echo true || echo false)"
  knob_key BEST_METRIC gsm8k_guard.best_metric "$(hydra_quote "$BEST_METRIC")"
else
  knob_key MODEL_PATH model.path "$(hydra_quote "$MODEL_PATH")"
  knob_key NDEVICES_PER_NODE trainer.n_gpus_per_node "$NDEVICES_PER_NODE"
  knob_key TRAIN_BATCH_SIZE data.train_batch_size "$TRAIN_BATCH_SIZE"
  knob_key MAX_LENGTH data.max_length "$MAX_LENGTH"
  knob_key SFT_LR optim.lr "$SFT_LR"
  knob_key TOTAL_EPOCHS trainer.total_epochs "$TOTAL_EPOCHS"
  knob_key TOTAL_TRAINING_STEPS trainer.total_training_steps "$TOTAL_TRAINING_STEPS"
  knob_key SAVE_FREQ trainer.save_freq "$SAVE_FREQ"
  knob_key TEST_FREQ trainer.test_freq "$TEST_FREQ"
  knob_key MAX_CKPT_TO_KEEP trainer.max_ckpt_to_keep "$MAX_CKPT_TO_KEEP"
  knob_key SFT_TRAIN_FILE data.train_files "[$(hydra_quote "$SFT_TRAIN_FILE")]"
  knob_key SFT_TEST_FILE data.val_files "[$(hydra_quote "$SFT_TEST_FILE")]"
  knob_key PROJECT_NAME trainer.project_name "$(hydra_quote "$PROJECT_NAME")"
  knob_key EXPERIMENT_NAME trainer.experiment_name "$(hydra_quote "$EXPERIMENT_NAME")"
  knob_key RUN_DIR trainer.default_local_dir "$(hydra_quote "$RUN_DIR")"
  knob_key LOGGER trainer.logger "[$LOGGER]"
fi
if [[ "$RESUME" == disable ]]; then knob_key RESUME trainer.resume_mode disable; fi

# Every knob of verl_gsm8k/preflight/knobs.py's table that is set here gets its type and range
# checked, in well under a second, before the slow preflight: one line per bad value, exit 2.
check_knobs() {
  local name values=()
  for name in $("$PYTHON" -m verl_gsm8k.preflight.knobs --names); do
    if [[ -n "${!name+set}" ]]; then values+=("$name=${!name}"); fi
  done
  "$PYTHON" -m verl_gsm8k.preflight.knobs "${values[@]}"
}

# The SFT trainer refuses a knob it cannot honour: torchrun --standalone is one node.
check_trainer_knobs() {
  if [[ "$TRAINER" == sft && "$NNODES" != 1 ]]; then
    echo "recipe: NNODES=$NNODES: the SFT recipe trains on one node (torchrun --standalone); set NDEVICES_PER_NODE for more devices" >&2
    return 2
  fi
  if [[ ${#IGNORED_KNOBS[@]} -gt 0 ]]; then
    echo "recipe: ignoring ${IGNORED_KNOBS[*]}: not knobs of verl's $TRAINER_LABEL trainer (docs/guide.md, Knobs)" >&2
  fi
  return 0
}

# verl's entry point: main_ppo starts Ray and its workers itself; the SFT trainer runs one process
# per device under torchrun (`python -m torch.distributed.run`, with this PYTHON).
# PPO: the driver starts in a session of its own (verl_gsm8k/guard/reap.py exec), with SIGTERM
# blocked, a mask every process it starts inherits (Ray's daemons and workers): a SIGTERM to
# every process of the job reaches this shell (request_stop) and leaves them running to save the
# step in flight; a SIGTERM to one of them alone is a stop request too
# (verl_gsm8k/verl_plugins/stop_on_sigterm.py). vLLM's engine processes unblock it (docs/slurm.md).
if [[ "$TRAINER" == ppo ]]; then
  VERL_MODULE=verl.trainer.main_ppo
  TRAIN_LAUNCHER=("$PYTHON" -m verl_gsm8k.guard.reap exec -- "$PYTHON")
else
  VERL_MODULE=verl.trainer.sft_trainer
  TRAIN_LAUNCHER=("$PYTHON" -m torch.distributed.run --standalone --nnodes=1
                  "--nproc_per_node=$NDEVICES_PER_NODE")
fi

# verl's entry point with our config: verl_main [hydra flags] -- [user overrides, which go last].
# With `--cfg job` (DRY_RUN) Hydra prints the composed config and exits: one plain process.
verl_main() {
  local flags=() launcher=("${TRAIN_LAUNCHER[@]}")
  while [[ $# -gt 0 && "$1" != "--" ]]; do flags+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  if [[ " ${flags[*]} " == *" --cfg "* ]]; then launcher=("$PYTHON"); fi
  "${launcher[@]}" -m "$VERL_MODULE" --config-path "$ROOT/configs" --config-name "$CONFIG_NAME" \
    "${flags[@]}" "${DEVICE_OVERRIDES[@]}" "${OVERRIDES[@]}" "${RECIPE_OVERRIDES[@]}" "$@"
}

# First use on a CPU: build the tiny model and prepare the shipped GSM8K sample, if missing.
prepare_cpu_defaults() {
  if [[ "$MODEL_PATH" == "$TINY_MODEL_DIR" && ! -e "$MODEL_PATH/config.json" ]]; then
    echo "recipe: building the tiny random Qwen2 (offline, once) -> $MODEL_PATH"
    "$PYTHON" -m verl_gsm8k.common.tiny_model "$MODEL_PATH" --force >/dev/null
  fi
  if [[ "${USE_SAMPLE_DATA:-0}" == 1 && ! -e "$TRAIN_FILE" ]]; then
    echo "recipe: no data prepared in $DATA_HOME: preparing the GSM8K sample shipped in data_prep/sample -> $DATA_DIR"
    "$PYTHON" -m "$DATA_PREP" --source "$ROOT/data_prep/sample" --out-dir "$DATA_DIR" >/dev/null
  fi
  if [[ "$MODEL_PATH" == "$TINY_MODEL_DIR" ]]; then
    echo "recipe: CPU run of a TINY RANDOM model: the $TRAINER_LABEL loop is real, its accuracy means nothing (docs/cpu.md)."
  fi
}

# verl's max_*_ckpt_to_keep prunes only what the current process saved: after a launch, apply the
# limit to the whole run directory, never removing the checkpoint a relaunch resumes from nor the
# kept best (verl_gsm8k/guard/prune.py; the guarded trainer prunes the same way after each save).
prune_checkpoints() {
  [[ "$MAX_CKPT_TO_KEEP" =~ ^[0-9]+$ && "$MAX_CKPT_TO_KEEP" -gt 0 ]] || return 0
  "$PYTHON" -m verl_gsm8k.guard.prune "$RUN_DIR" --keep "$MAX_CKPT_TO_KEEP"
}

# wandb without a key: WANDB_MODE=offline logs to WANDB_DIR with no key and no network, for
# `wandb sync` later. The key itself is never printed.
say_where_wandb_logs() {
  mkdir -p "$WANDB_DIR"
  case "${WANDB_MODE:-}" in
    offline)
      echo "recipe: wandb offline: this run is logged under $WANDB_DIR/wandb/offline-run-*; upload it later with: wandb sync $WANDB_DIR/wandb/offline-run-*" ;;
    disabled) echo "recipe: wandb disabled (WANDB_MODE=disabled): nothing is logged to wandb" ;;
    *)
      if [[ -z "${WANDB_API_KEY:-}" && ! -e "$HOME/.netrc" ]]; then
        echo "recipe: LOGGER has wandb but no WANDB_API_KEY (and no wandb login): wandb will fail to start; WANDB_MODE=offline logs locally with no key and no network" >&2
      fi ;;
  esac
}

# The preflight on the final override list; with TOKEN_BUDGET=auto (PPO/GRPO, no budget key among
# the launch's own overrides) the budget it picks for this card joins RECIPE_OVERRIDES, before the
# user's key=value overrides.
run_preflight() {
  local fit=() budget_file="" rc=0 arg
  if [[ "$TRAINER" == ppo && "$TOKEN_BUDGET" == auto ]]; then
    budget_file=$(mktemp "${TMPDIR:-/tmp}/token-budget.XXXXXX")
    fit=(--fit-budget "$budget_file")
    for arg in "$@"; do
      if [[ "$arg" == *max_token_len_per_gpu=* ]]; then fit=(); fi
    done
  fi
  local entry=(verl_gsm8k.preflight)
  if [[ "$DRY_RUN" == 1 ]]; then   # then verl's own --cfg job, in the same Python (verl imported once)
    entry=(verl_gsm8k.preflight.dry_run --verl-module "$VERL_MODULE" --config-path "$ROOT/configs"
           --user-args "$#")
  fi
  "$PYTHON" -m "${entry[@]}" "${fit[@]}" --trainer "$TRAINER" --config-name "$CONFIG_NAME" \
    -- "${DEVICE_OVERRIDES[@]}" "${OVERRIDES[@]}" "${RECIPE_OVERRIDES[@]}" "$@" || rc=$?
  if [[ $rc == 0 && ${#fit[@]} -gt 0 && -s "$budget_file" ]]; then
    mapfile -t fit <"$budget_file"
    RECIPE_OVERRIDES+=("${fit[@]}")
  fi
  if [[ -n "$budget_file" ]]; then rm -f "$budget_file"; fi
  return "$rc"
}

# What this launch is, in RUN_DIR/launches/launch-<stamp>.yaml (verl_gsm8k/resume/), after the
# guard that refuses to resume another experiment's checkpoint silently (RESUME).
record_launch() {
  local stamp=$1 name args=()
  shift
  for name in $("$PYTHON" -m verl_gsm8k.preflight.knobs --names) "${PATH_KNOBS[@]}"; do
    if [[ -n "${!name+set}" ]]; then args+=(--knob "$name=${!name}"); fi
  done
  for name in "${KNOB_KEYS[@]}"; do args+=(--knob-key "$name"); done
  for name in "$@"; do args+=(--user "$name"); done
  "$PYTHON" -m verl_gsm8k.resume --run-dir "$RUN_DIR" --stamp "$stamp" --recipe "$RECIPE" \
    --trainer "$TRAINER" --config-name "$CONFIG_NAME" --resume "$RESUME" "${args[@]}" -- \
    "${DEVICE_OVERRIDES[@]}" "${OVERRIDES[@]}" "${RECIPE_OVERRIDES[@]}" "$@"
}

# Every FSDP rank writes its checkpoint shards to RUN_DIR on its own node (docs/scaling.md, "Where
# things land"): with several nodes RUN_DIR must be storage they all mount. /tmp is usually
# node-local, and Ray unpacks `ray job submit --working-dir` under <temp dir>/session_*/
# runtime_resources/, a cache it deletes (the default RUN_DIR is inside the repository copy).
warn_unshared_run_dir() {
  [[ "$NNODES" =~ ^[0-9]+$ && "$NNODES" -gt 1 ]] || return 0
  local why=""
  case "$RUN_DIR/" in
    */session_*/runtime_resources/*) why="inside Ray's session directory (a working_dir copy Ray deletes)" ;;
    /tmp/*) why="under /tmp, usually a node's local disk" ;;
    *) return 0 ;;
  esac
  echo "recipe: warning: NNODES=$NNODES and RUN_DIR=$RUN_DIR is $why: every node writes its ranks' checkpoint shards there, and merge.sh and a resume need them all in one place; set RUNS_ROOT to storage every node mounts (docs/scaling.md)" >&2
}

# How a launch lives and ends: the run-directory lock, stop requests, the Slurm deadline, waiting
# for verl, the requeue (lock_run_dir ... requeue_if_stopped, called by launch below).
# shellcheck source=lifecycle.sh
source "$ROOT/recipes/lifecycle.sh"

launch() {
  if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    echo "usage: [KNOB=value ...] bash recipes/$RECIPE.sh [verl.key=value ...]"
    echo "Knobs and their verl keys: docs/guide.md (Knobs). Extra key=value arguments override everything."
    echo "DRY_RUN=1 runs the preflight and prints the final config without a GPU."
    return 0
  fi
  check_knobs || exit $?
  check_trainer_knobs || exit $?
  if [[ -n "$ATTENTION_REFUSAL" ]]; then echo "$ATTENTION_REFUSAL" >&2; exit 2; fi
  echo "recipe: $RECIPE | config: configs/$CONFIG_NAME.yaml | model: $MODEL_PATH | run dir: $RUN_DIR"
  local where=""
  if on_ray_cluster; then where=" on the Ray cluster at RAY_ADDRESS=$RAY_ADDRESS"; fi
  echo "recipe: device: $TRAIN_ON (DEVICE=$DEVICE)$where | attention: $ATTENTION_LINE"
  warn_unshared_run_dir
  if [[ "$TRAIN_ON" == cpu ]]; then prepare_cpu_defaults; fi
  if declare -F prepare_run >/dev/null; then prepare_run; fi
  if [[ "$SKIP_PREFLIGHT" != 1 ]]; then
    run_preflight "$@" || exit $?
    if [[ "$DRY_RUN" == 1 ]]; then return 0; fi   # verl's --cfg job ran in the preflight's process
  fi
  if [[ "$DRY_RUN" == 1 ]]; then
    verl_main --cfg job -- "$@"
    return $?
  fi
  if [[ "$TRAIN_ON" == none ]] || { [[ "$TRAIN_ON" == gpu ]] && ! has_gpu && ! on_ray_cluster; }; then
    local here="bash recipes/smoke_tiny.sh, or DEVICE=cpu bash recipes/$RECIPE.sh"
    if [[ "$TRAINER" == sft ]]; then here="DEVICE=cpu bash recipes/$RECIPE.sh"; fi
    local cluster=""
    if [[ -n "${RAY_ADDRESS:-}" && "$TRAINER" == ppo ]]; then
      cluster=" To train on the GPUs of the Ray cluster at RAY_ADDRESS=$RAY_ADDRESS: DEVICE=gpu."
    fi
    echo "recipe: preflight passed, but no NVIDIA GPU is visible here. To train on this CPU at toy scale: $here; DRY_RUN=1 prints the final config.$cluster" >&2
    exit 3
  fi
  local stamp
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  lock_run_dir "$stamp"
  if [[ "$TRAINER" == ppo ]]; then plan_deadline || exit $?; plan_grace || exit $?; fi
  record_launch "$stamp" "$@" || exit $?
  mkdir -p "$RUN_DIR/metrics" "$RUN_DIR/logs"
  if logs_to_wandb; then say_where_wandb_logs; fi
  # verl's file logger truncates its file on open: one file per launch keeps a resumed run's history.
  export VERL_FILE_LOGGER_PATH="$RUN_DIR/metrics/metrics-$stamp.jsonl"
  echo "recipe: metrics -> $VERL_FILE_LOGGER_PATH | console log -> $RUN_DIR/logs/console-$stamp.log"
  local ray_env=()   # on a hand-started cluster the trainer runs in a worker of `ray start`
  if [[ -n "${RAY_ADDRESS:-}" && "$TRAINER" == ppo ]]; then
    ray_env=("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$(hydra_quote "$VERL_FILE_LOGGER_PATH")")
  fi
  rm -f "$RUN_DIR/stop_requested"   # a request of an earlier launch is not this one's
  set +e
  # In the background, so that SIGTERM reaches the trap while verl runs (bash runs a trap only
  # once the foreground command has ended); the pipeline's status is verl's (pipefail off here).
  # A background command ignores Ctrl-C (SIGINT): the INT trap stops verl's processes instead.
  trap 'request_stop' TERM
  trap 'interrupt' INT
  # Every process verl starts carries these two variables (Ray's included, which leave this
  # shell's process group): once verl has ended, whatever is left of them is stopped, with one line.
  local launch_id="$stamp-$$-${HOSTNAME:-localhost}"
  # A SIGTERM to every process of the job (Slurm without `B:`, a preemption) ends neither this
  # subshell (trapped: verl's own status is still the launch's) nor tee (ignored: verl's last
  # lines still land in the log); verl's processes get the signal as sent.
  VERL_STATUS_FILE=$(mktemp "${TMPDIR:-/tmp}/gsm8k-verl-status.XXXXXX")
  ( trap ':' TERM; set +o pipefail; export GSM8K_LAUNCH_ID=$launch_id GSM8K_LAUNCH_RUN_DIR=$RUN_DIR
    export STOP_GRACE_S
    verl_main "${ray_env[@]}" -- "$@" 2>&1 | (trap '' TERM; exec tee "$RUN_DIR/logs/console-$stamp.log")
    exit_recorded "${PIPESTATUS[0]}" ) &
  VERL_PID=$!
  wait_for_verl
  local status=$?
  rm -f "$VERL_STATUS_FILE"
  "$PYTHON" -m verl_gsm8k.guard.reap stop --launch "$launch_id" --session-of "$RUN_DIR" || true
  trap - TERM INT
  set -e
  [[ "$status" == 0 ]] && prune_checkpoints
  if [[ "$TRAINER" == ppo ]]; then
    echo "recipe: verl exited with $status. Report: python -m verl_gsm8k.report $RUN_DIR"
    local verl_status=$status
    status=0   # the watchdog's stop and a SIGTERM have their own statuses (guard/status.py)
    "$PYTHON" -m verl_gsm8k.guard.status "$RUN_DIR" --stamp "$stamp" --verl-status "$verl_status" \
      ${STOP_DEADLINE:+--stopped} || status=$?
  else
    echo "recipe: verl exited with $status. Metrics: $VERL_FILE_LOGGER_PATH; to a Hugging Face model (a MODEL_PATH for the PPO recipes): bash scripts/merge.sh $RUN_DIR OUT_DIR"
  fi
  if declare -F after_run >/dev/null; then after_run "$status"; fi
  requeue_if_stopped "$status" "$stamp"
  exit "$status"
}
