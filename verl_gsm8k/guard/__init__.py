"""Protections for a long run: the health rules (rules.py), their thresholds (thresholds.py),
verl's metric names (vocab.py), pruning (prune.py), stopping without losing a step (stop.py)."""


def say(line: str) -> None:
    print(f"gsm8k_guard: {line}", flush=True)
