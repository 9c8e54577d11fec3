"""Protections for a long run: health rules, thresholds, metric names, pruning, stopping."""


def say(line: str) -> None:
    print(f"gsm8k_guard: {line}", flush=True)
