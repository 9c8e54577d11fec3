"""python -m verl_gsm8k.questions: the per-question comparison page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .page import write
from .runs import evalscope_reviews, load_columns, validation_steps
from .table import InputError, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.questions",
        description="One row per question, one column per validation dump: which changed.",
    )
    parser.add_argument(
        "dumps",
        nargs="*",
        type=Path,
        help="verl validation dumps <step>.jsonl or EvalScope reviews/<model>/gsm8k_main.jsonl, "
        "one column each, in the order given",
    )
    parser.add_argument(
        "--run",
        type=Path,
        action="append",
        default=[],
        help="a run directory: every RUN/validation/<step>.jsonl becomes a column (repeatable)",
    )
    parser.add_argument(
        "--evalscope",
        type=Path,
        action="append",
        default=[],
        help="an evaluation folder (scripts/eval.sh's output, or RUN_DIR/checkpoint_eval from "
        "eval.sh --run): each model's EvalScope reviews become a column, baseline first, then "
        "step-N in order (repeatable)",
    )
    parser.add_argument(
        "--mode",
        default=None,
        help="with --evalscope: the evaluation mode folder to read (default: the first found)",
    )
    parser.add_argument(
        "--last-only",
        action="store_true",
        help="with several --run: only each run's last validation step",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder: questions.html, data/, summary.json"
    )
    args = parser.parse_args(argv)
    try:
        inputs: list[tuple[Path, str | None]] = [(p, None) for p in args.dumps]
        for run in args.run:
            steps = validation_steps(run)
            if args.last_only:
                steps = steps[-1:]
            inputs += [(p, f"{run.name}:{p.stem}") for p in steps]
        for eval_dir in args.evalscope:
            inputs += evalscope_reviews(eval_dir, args.mode)
        if not inputs:
            parser.error("give result files, --run RUN_DIR or --evalscope EVAL_DIR")
        columns, note = load_columns(inputs)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if note:
        print(f"warning: {note}", file=sys.stderr)
    table = build(columns)
    if not table["questions"]:
        print("error: no question is in every input", file=sys.stderr)
        return 2
    page = write(columns, table, args.out)
    print(f"wrote {page} ({table['questions']} questions x {len(columns)} columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
