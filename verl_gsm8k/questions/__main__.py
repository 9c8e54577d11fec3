"""python -m verl_gsm8k.questions: the per-question comparison page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_gsm8k.common.terminal import clean

from .page import write
from .runs import STEPS, evalscope_reviews, load_columns, run_columns
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
        "--step",
        choices=STEPS,
        default="all",
        help="which validation steps of each --run become columns: all (default), last, or "
        "best (the highest accuracy, the earliest of equals)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder: questions.html, data/, summary.json"
    )
    args = parser.parse_args(argv)
    try:
        if not (args.dumps or args.run or args.evalscope):
            parser.error("give result files, --run RUN_DIR or --evalscope EVAL_DIR")
        # columns in the order given: result files, then runs, then evaluation folders
        groups = [load_columns([(p, None) for p in args.dumps])] if args.dumps else []
        groups += [run_columns(run, args.step, f"{run.name}:") for run in args.run]
        for eval_dir in args.evalscope:
            groups.append(load_columns(evalscope_reviews(eval_dir, args.mode)))
        columns = [column for found, _ in groups for column in found]
        notes = [note for _, note in groups if note]
    except InputError as exc:
        print(f"error: {clean(exc)}", file=sys.stderr)
        return 2
    for line in notes:
        print(f"warning: {clean(line)}", file=sys.stderr)
    table = build(columns)
    if not table["questions"]:
        print("error: no question is in every input", file=sys.stderr)
        return 2
    page = write(columns, table, args.out)
    print(f"wrote {page} ({table['questions']} questions x {len(columns)} columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
