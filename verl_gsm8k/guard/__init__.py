"""Protections for a long run, applied by the trainer (ppo_trainer/guard_base.py): the health rules
(rules.py), their thresholds (thresholds.py), verl's metric names (vocab.py), pruning (prune.py),
stopping without losing a step (stop.py). ``say``: the trainers' and plugins' lines, ``gsm8k_guard:
...``."""


def say(line: str) -> None:
    print(f"gsm8k_guard: {line}", flush=True)
