"""Protections for a long run, applied by the trainer every PPO launch runs
(``verl_gsm8k/ppo_trainer/guard_base.py``): the health rules the watchdog runs and the report
too (rules.py), their one table of thresholds (thresholds.py) and verl's metric names they read
(vocab.py), pruning (prune.py), stopping early without losing a step (stop.py). Their files:
common/run_dir.py. ``say``: the trainers' and plugins' lines, ``gsm8k_guard: ...``."""


def say(line: str) -> None:
    print(f"gsm8k_guard: {line}", flush=True)
