#!/usr/bin/env bash
# Does the loop LEARN? On a CPU, in minutes, with no setting (on a machine with a GPU it trains
# there instead, a path the tests do not run): a warm-started tiny model gets better
# at a toy task in GSM8K's format under PPO (actor + critic, GAE) or any algorithm of
# docs/algorithms.md, each with its own config (configs/gsm8k_<ALGO>.yaml):
#   bash recipes/learn_tiny.sh              # PPO: critic, GAE (the default)
#   ALGO=grpo bash recipes/learn_tiny.sh    # GRPO, or any algorithm of docs/algorithms.md's table
# Every algorithm keeps this recipe's toy settings (ROLLOUT_N=8 for all, those whose own recipe
# ships one response per prompt included: docs/algorithms.md, "On the CPU toy task");
# DAPO's overlong buffer is a fifth of the toy's response length, as the paper's is of its own.
# First use builds the toy task and the warm start (an SFT run of verl's, merged), cached under
# CACHE_DIR/learn-tiny/: verl_gsm8k/launch/learn_tiny.py. At the end the report prints validation
# accuracy (greedy, the toy test split) at step 0 and at the last step.
# These settings fit a 0.37M-parameter model on a toy task, NOT Qwen2.5 on GSM8K: recipes/README.md.
# Every knob is an environment variable (docs/knobs.md); key=value arguments win over all.
set -euo pipefail

recipe=(
  --recipe learn_tiny --config gsm8k_ppo --hooks learn_tiny   # ALGO picks the config
  --cpu-by-default             # no GPU: train on the CPU instead of stopping
  ALGO=ppo
  SEED=0                       # toy data, warm start and RL data order
  TOY_TASK=easy                # easy: does it learn?
                               # products: does it learn the calculator? (docs/tools.md)
  TRAIN_BATCH_SIZE=16
  PPO_MINI_BATCH_SIZE=8
  ROLLOUT_N=8
  MAX_PROMPT_LENGTH=128
  MAX_RESPONSE_LENGTH=24
  ACTOR_LR=3e-4
  CRITIC_LR=1e-3
  TOTAL_TRAINING_STEPS=20
  TEST_FREQ=5
  SAVE_FREQ=10                 # steps 10 and 20: the last to merge, both to sweep
  KEEP_BEST=0                  # no extra save of a best step 5 or 15: the sweep sees 10, 20
  # The actor's learning rate decays (cosine, to a tenth by the last step): the format is learned
  # in the first ~10 steps, and full-size updates after that only wear down what the warm start
  # knew (docs/learning.md, "Why sums were lost").
  actor_rollout_ref.actor.optim.lr_scheduler_type=cosine
  actor_rollout_ref.actor.optim.min_lr_ratio=0.1
)
exec "$(dirname "${BASH_SOURCE[0]}")/../scripts/python" -m verl_gsm8k.launch "${recipe[@]}" -- "$@"
