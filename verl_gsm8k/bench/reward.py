"""Throughput of the GSM8K reward functions: ours (rewards/gsm8k.py) vs verl's built-in scorer.

Builds a realistic mix of responses (correct, wrong, boxed, noisy formatting, long, no marker),
scores the same inputs with each scorer, and prints responses/second plus what that costs per
training step. Not a test: numbers depend on the machine.

    python -m verl_gsm8k.bench.reward [--n 20000] [--seed 0] [--data path/to/gsm8k.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rewards.gsm8k import (
    compute_score,
    compute_score_flexible,
    compute_score_format,
)

STEP_SIZES = (128, 1024)  # responses per training step (batch x rollout.n), small and large
KINDS = ("correct", "wrong", "boxed", "noisy", "long", "no_marker")


def _synthetic_rows(rng: random.Random, count: int) -> list[tuple[str, int]]:
    """GSM8K-like (reasoning, answer) pairs when no --data file is given."""
    rows = []
    for _ in range(count):
        a, b, c = rng.randint(2, 500), rng.randint(2, 60), rng.randint(2, 9)
        answer = (a + b) * c
        reasoning = (
            f"Natalia sold {a} clips in April and {b} more in May, so {a} + {b} = {a + b}.\n"
            f"Each clip costs ${c}, so she earned {a + b} x {c} = ${answer}.\n"
        )
        rows.append((reasoning, answer))
    return rows


def _data_rows(path: Path) -> list[tuple[str, int]]:
    """(reasoning without the final line, integer answer) from a GSM8K jsonl file."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                answer = json.loads(line)["answer"]
                reasoning, _, final = answer.rpartition("####")
                reasoning = re.sub(r"<<[^>]*>>", "", reasoning)  # calculator annotations
                rows.append((reasoning, int(final.strip().replace(",", ""))))
    return rows


def build_mix(n: int, seed: int, data: Path | None) -> list[tuple[str, str, str]]:
    """n (kind, response, ground truth) triples, the kinds in equal shares."""
    rng = random.Random(seed)
    rows = _data_rows(data) if data else _synthetic_rows(rng, 2000)
    filler = "Let me double-check each step of the computation carefully. "
    mix = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        reasoning, answer = rng.choice(rows)
        noisy = rng.choice([f"${answer:,}.00", f"**{answer}**", f"{answer}.", f"{answer} dollars"])
        response = {
            "correct": f"{reasoning}#### {answer}",
            "wrong": f"{reasoning}#### {answer + rng.randint(1, 9)}",
            "boxed": f"{reasoning}So the answer is $\\boxed{{{answer}}}$.",
            "noisy": f"{reasoning}####{rng.choice(['', ' '])}{noisy}",
            "long": filler * rng.randint(30, 120) + f"{reasoning}#### {answer}",
            "no_marker": f"{reasoning}The answer is {answer}",
        }[kind]
        mix.append((kind, response, str(answer)))
    return mix


def _time(fn: Callable[[str, str], float], mix: list[tuple[str, str, str]], repeat: int):
    """Best wall time over `repeat` passes, and the mean score of the last pass."""
    best, total = float("inf"), 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        total = sum(fn(response, truth) for _, response, truth in mix)
        best = min(best, time.perf_counter() - start)
    return best, total / len(mix)


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            names = [
                line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")
            ]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.reward", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--n", type=int, default=30000, help="number of responses to score (default 30000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the response mix (default 0)")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="GSM8K jsonl (question/answer rows) to draw reasoning from; default: synthetic",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed passes per scorer, best kept (default 3)"
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.repeat < 1:
        parser.error("--n and --repeat must be positive")

    mix = build_mix(args.n, args.seed, args.data)
    chars = sum(len(response) for _, response, _ in mix) / len(mix)
    scorers: dict[str, Callable[[str, str], float]] = {
        "ours compute_score": lambda r, t: compute_score("openai/gsm8k", r, t)["score"],
        "ours compute_score_flexible": lambda r, t: compute_score_flexible("gsm8k", r, t)["score"],
        "ours compute_score_format": lambda r, t: compute_score_format("gsm8k", r, t)["score"],
    }
    try:
        from verl.utils.reward_score import gsm8k as verl_gsm8k

        scorers["verl built-in gsm8k"] = lambda r, t: float(verl_gsm8k.compute_score(r, t))
    except ImportError:
        print("verl is not importable: its built-in scorer is skipped")

    print(
        f"{len(mix)} responses ({', '.join(KINDS)}; mean {chars:.0f} chars), "
        f"source: {args.data or 'synthetic'}, seed {args.seed}, best of {args.repeat}"
    )
    print(f"machine: {_machine()} (one process, one core used)")
    print(f"{'scorer':<30}{'responses/s':>14}{'us/response':>13}{'mean score':>12}")
    for name, fn in scorers.items():
        seconds, mean = _time(fn, mix, args.repeat)
        rate = len(mix) / seconds
        print(f"{name:<30}{rate:>14,.0f}{1e6 / rate:>13.1f}{mean:>12.3f}")
        steps = ", ".join(f"{size} responses {1e3 * size / rate:.1f} ms" for size in STEP_SIZES)
        print(f"{'':<4}per training step: {steps}")
    print("a PPO/GRPO step on GSM8K spends seconds to minutes in generation and updates;")
    print("reward scoring at the rates above is a negligible share of it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
