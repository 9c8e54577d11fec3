"""The trainer every PPO launch runs: verl's own PPO trainer, guarded and traced, whichever of its
two the config runs: the v1 ``sync`` trainer (``PPOTrainerSync``, every recipe but two) or the
legacy ``RayPPOTrainer`` (``trainer.use_v1=false``: the LoRA and ReMax recipes).

The launcher (``verl_gsm8k/launch/``) sets ``trainer.v1.trainer_mode=gsm8k`` (``MODE``) for every
PPO launch and names ``verl_gsm8k.verl_plugins.register_trainer`` in ``VERL_USE_EXTERNAL_MODULES``;
that plugin puts the classes below where verl builds its trainer (v1: verl's trainer registry;
legacy: the name ``RayPPOTrainer`` in ``verl.trainer.main_ppo_v0``). ``python -m
verl_gsm8k.preflight`` checks the choice (``preflight/trainer_choice.py``). The modules:

- ``guard_base.py`` (``GuardBase``): the guard, whatever the loop: every checkpoint whole (atomic
  tracker and ``data.pt``), stamped with its launch and pruned over the whole run; the divergence
  watchdog before each save (its rules: ``verl_gsm8k/guard/``); a save, then a stop, on SIGTERM,
  before a Slurm job's end, or after SAVE_EVERY_MIN; the kept best checkpoint after validation
  (docs/reliability.md); wandb through a stop that ended its service (``wandb_gap.py``: the next
  launch sends it the steps it lost);
- ``trace_lines.py`` (``Tracer``): the per-token trace of a few samples a step,
  ``RUN_DIR/trace/<step>.jsonl`` (what is recorded and how: ``verl_gsm8k/trace/``; docs/replay.md);
- ``guarded.py`` (``GuardedTrainer``) and ``traced.py`` (``TracingTrainer``, the registered
  class): both on verl's v1 trainer, whose tensors live in TransferQueue;
- ``legacy.py`` (``GuardedLegacyTrainer``): both on verl's legacy trainer, from its batch.

Nothing heavy is imported here: importing verl's trainer costs seconds, so each module is imported
by its own name.
"""

MODE = "gsm8k"  # trainer.v1.trainer_mode of every PPO launch
