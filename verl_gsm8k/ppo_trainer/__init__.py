"""verl's PPO trainer with the guard (guard_base.py) and the trace (trace_lines.py): v1
(traced.py) or legacy (legacy.py). Nothing heavy imported here."""

MODE = "gsm8k"  # trainer.v1.trainer_mode of every PPO launch
