"""The trainer every PPO launch runs (trainer.v1.trainer_mode=gsm8k): verl's own with the guard
(guard_base.py) and the per-token trace (trace_lines.py), on its v1 trainer (traced.py) or its
legacy one (legacy.py). Nothing heavy imported here."""

MODE = "gsm8k"  # trainer.v1.trainer_mode of every PPO launch
