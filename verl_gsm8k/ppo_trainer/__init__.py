"""The trainer every PPO launch runs: verl's v1 ``sync`` trainer (``PPOTrainerSync``), guarded and
traced, registered in verl's trainer registry as ``gsm8k``.

The launcher (``verl_gsm8k/launch/``) sets ``trainer.v1.trainer_mode=gsm8k`` for every PPO launch
and names ``verl_gsm8k.verl_plugins.register_trainer`` in ``VERL_USE_EXTERNAL_MODULES``; that plugin
imports ``traced.py`` in verl's TaskRunner right after ``verl.trainer.ppo.v1``, and
``@register_trainer`` there enters the class in verl's registry. ``python -m verl_gsm8k.preflight``
checks the choice (``preflight/trainer_choice.py``). What it adds to verl's sync trainer, one method
at a time:

- ``guarded.py`` (``GuardedTrainer``): every checkpoint whole (atomic tracker and ``data.pt``),
  stamped with its launch and pruned over the whole run; the divergence watchdog before each save
  (its rules: ``verl_gsm8k/guard/``); a save, then a stop, on SIGTERM or before a Slurm job's end;
  the kept best checkpoint after validation (docs/reliability.md); wandb through a stop that
  ended its service (``wandb_gap.py``: the next launch sends it the steps it lost);
- ``traced.py`` (``TracingTrainer``, the registered class, built on ``GuardedTrainer``): the
  per-token trace of a few samples a step, ``RUN_DIR/trace/<step>.jsonl`` (what is recorded and
  how: ``verl_gsm8k/trace/``; docs/replay.md).

The LoRA recipe runs verl's legacy trainer (``trainer.use_v1=false``), which has no registry:
none of this runs there, and the preflight says so. Nothing is imported here: importing verl's
trainer costs seconds, so each module is imported by its own name.
"""
