"""The trainer every PPO launch runs (``trainer.v1.trainer_mode=gsm8k``, put in place by
verl_plugins/register_trainer.py): verl's own, with the guard (guard_base.py) and the per-token
trace (trace_lines.py), on its v1 trainer (traced.py) or its legacy one (legacy.py: the LoRA and
ReMax recipes). Nothing heavy is imported here: each module by its own name."""

MODE = "gsm8k"  # trainer.v1.trainer_mode of every PPO launch
