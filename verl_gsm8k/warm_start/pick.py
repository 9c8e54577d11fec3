"""``python -m verl_gsm8k.warm_start SFT_RUN_DIR --test-file TEST.parquet --band 0.30-0.45``:
the saves with a ``huggingface/`` model scored in step order, the first in the band picked (none:
the closest, said so); stdout the picked step directory, stderr the scores; exit 2 bad input."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import STEP_N, saved_steps, step_dir
from verl_gsm8k.warm_start.band import distance, parse_band
from verl_gsm8k.warm_start.score import Score, read_questions, score


def saves(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, step directory) of every save with a Hugging Face model, in step order."""
    found = [(step, step_dir(run_dir, step)) for step in saved_steps(run_dir)]
    return [(step, path) for step, path in found if (path / "huggingface/config.json").is_file()]


def pick(candidates: list[tuple[int, Path]], band: tuple[float, float],
         scorer: Callable[[Path], Score], log: Callable[[str], None] = print,
         ) -> tuple[int, dict[int, Score]]:  # fmt: skip
    """The first save in the band (none after it scored), else the closest, the earliest of
    equals; and every score taken."""
    scores: dict[int, Score] = {}
    for step, path in candidates:
        got = scores[step] = scorer(path / "huggingface")
        log(f"warm start: step {step}: accuracy {got.marker:.3f}, "
            f"right in any format {got.any_format:.3f}")  # fmt: skip
        if distance(got.marker, band) == 0.0:
            return step, scores
    return min(scores, key=lambda s: (distance(scores[s].marker, band), s)), scores


def main(argv: list[str] | None = None) -> int:
    about = f"Print the {STEP_N} of an SFT run whose greedy accuracy first lies in a band."
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.warm_start", description=about)
    add = parser.add_argument
    add("run_dir", type=Path, help=f"the SFT run directory (its {STEP_N} saves)")
    add("--test-file", type=Path, required=True,
        help="verl RL parquet (prompt, reward_model.ground_truth, data_source)")  # fmt: skip
    add("--band", required=True, help="LOW-HIGH accuracy on the '#### N' line, e.g. 0.30-0.45")
    add("--max-new-tokens", type=int, default=24,
        help="greedy answer length: the RL run's max_response_length")  # fmt: skip
    add("--record", type=Path, help="write every score and the pick here (JSON)")
    args = parser.parse_args(argv)
    try:
        band, rows = parse_band(args.band), read_questions(args.test_file)
        candidates = saves(args.run_dir)
        if not candidates:
            raise ValueError(f"{args.run_dir}: no {STEP_N}/huggingface save")
    except (ValueError, OSError) as error:
        print(f"warm start: {error}", file=sys.stderr)
        return 2
    step, scores = pick(candidates, band, lambda model: score(model, rows, args.max_new_tokens),
                        log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    got, inside = scores[step], distance(scores[step].marker, band) == 0.0
    where = "in the band" if inside else "NONE IN THE BAND, the closest to"
    print(f"warm start: step {step} of {candidates[-1][0]}, accuracy {got.marker:.2f} (right in "
          f"any format {got.any_format:.2f}, {got.questions} test questions), {where} "
          f"{args.band}", file=sys.stderr)  # fmt: skip
    if args.record:
        record = {"run_dir": str(args.run_dir), "test_file": str(args.test_file),
                  "band": list(band), "picked_step": step, "in_band": inside,
                  "scores": {str(s): vars(v) for s, v in scores.items()}}  # fmt: skip
        write_atomic(args.record, json.dumps(record, indent=1) + "\n")
    print(dict(candidates)[step])
    return 0
