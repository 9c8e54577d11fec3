"""Pick the save of an SFT run whose greedy accuracy first lands in a band.

    python -m verl_gsm8k.warm_start SFT_RUN_DIR --test-file TEST.parquet --band 0.30-0.45

Every step directory of the run (common/run_dir.py) that holds a ``huggingface/`` model (verl's
``hf_model`` save: ``checkpoint.save_contents=[model,hf_model]``) is scored in step order
(``score.py``); the first whose marker accuracy lies in the band is picked. Where none does, the
save closest to the band is picked and the summary says so. The picked step directory is
printed on stdout (the input of ``scripts/merge.sh``); one line per scored save and
the summary go to stderr; ``--record`` keeps every score and the pick as JSON.

Exit 0 picked; 2 bad input (no such run, no scorable save, a bad band or test file): one line.
"""

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


def pick(
    candidates: list[tuple[int, Path]],
    band: tuple[float, float],
    scorer: Callable[[Path], Score],
    log: Callable[[str], None] = print,
) -> tuple[int, dict[int, Score]]:
    """Score the saves in step order, stop at the first in the band; else the closest (the
    earliest of equals). Returns the picked step and every score taken."""
    scores: dict[int, Score] = {}
    for step, path in candidates:
        scores[step] = scorer(path / "huggingface")
        log(
            f"warm start: step {step}: accuracy {scores[step].marker:.3f}, "
            f"right in any format {scores[step].any_format:.3f}"
        )
        if distance(scores[step].marker, band) == 0.0:
            return step, scores
    return min(scores, key=lambda s: (distance(scores[s].marker, band), s)), scores


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.warm_start",
        description="Pick the first save of an SFT run whose greedy accuracy on a verl RL test "
        f"parquet lies in a band; print its {STEP_N} directory.",
    )
    parser.add_argument("run_dir", type=Path, help=f"the SFT run directory (its {STEP_N} saves)")
    parser.add_argument(
        "--test-file",
        type=Path,
        required=True,
        help="verl RL parquet to score on (prompt, reward_model.ground_truth, data_source)",
    )
    parser.add_argument(
        "--band",
        required=True,
        help="LOW-HIGH: the accuracy on the '#### N' line to stop at (e.g. 0.30-0.45)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=24,
        help="response length of the greedy generation: the RL run's max_response_length",
    )
    parser.add_argument("--record", type=Path, help="write every score and the pick here (JSON)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        band = parse_band(args.band)
        rows = read_questions(args.test_file)
    except (ValueError, OSError) as error:
        print(f"warm start: {error}", file=sys.stderr)
        return 2
    candidates = saves(args.run_dir)
    if not candidates:
        print(f"warm start: {args.run_dir}: no {STEP_N}/huggingface save", file=sys.stderr)
        return 2
    step, scores = pick(
        candidates,
        band,
        lambda model: score(model, rows, args.max_new_tokens),
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    picked = scores[step]
    inside = distance(picked.marker, band) == 0.0
    where = "in the band" if inside else "NONE IN THE BAND, the closest to"
    print(
        f"warm start: step {step} of {candidates[-1][0]}, accuracy {picked.marker:.2f} (right in "
        f"any format {picked.any_format:.2f}, {picked.questions} test questions), {where} "
        f"{args.band}",
        file=sys.stderr,
    )
    if args.record:
        record = {
            "run_dir": str(args.run_dir),
            "test_file": str(args.test_file),
            "band": list(band),
            "picked_step": step,
            "in_band": inside,
            "scores": {str(s): vars(v) for s, v in scores.items()},
        }
        write_atomic(args.record, json.dumps(record, indent=1) + "\n")
    print(dict(candidates)[step])
    return 0
