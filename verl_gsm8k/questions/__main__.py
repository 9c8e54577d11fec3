"""python -m verl_gsm8k.questions DUMP.jsonl ... | --run RUN_DIR | --evalscope EVAL_DIR --out DIR:
the questions page of validation dumps, runs or evaluations, columns in the order given."""

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
    parser.add_argument("dumps", nargs="*", type=Path,
                        help="validation dumps <step>.jsonl or EvalScope reviews "
                        "<model>/gsm8k_main.jsonl, a column each")  # fmt: skip
    parser.add_argument(
        "--run",
        type=Path,
        action="append",
        default=[],
        help="a run directory: each validation/<step>.jsonl a column",
    )
    parser.add_argument("--evalscope", type=Path, action="append", default=[],
                        help="an evaluation folder (eval.sh's output): each model's EvalScope "
                        "reviews a column, the baseline first, then step-N")  # fmt: skip
    parser.add_argument("--mode", help="with --evalscope: the mode folder (default: the first)")
    parser.add_argument(
        "--step",
        choices=STEPS,
        default="all",
        help="which validation steps of each --run (default: all)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder: questions.html, data/, summary.json"
    )
    args = parser.parse_args(argv)
    if not (args.dumps or args.run or args.evalscope):
        parser.error("give result files, --run RUN_DIR or --evalscope EVAL_DIR")
    try:
        groups = [load_columns([(p, None) for p in args.dumps])] if args.dumps else []
        groups += [run_columns(run, args.step, f"{run.name}:") for run in args.run]
        groups += [load_columns(evalscope_reviews(d, args.mode)) for d in args.evalscope]
    except InputError as err:
        print(f"error: {clean(err)}", file=sys.stderr)
        return 2
    for _, note in groups:
        if note:
            print(f"warning: {clean(note)}", file=sys.stderr)
    columns = [column for found, _ in groups for column in found]
    table = build(columns)
    if not table["questions"]:
        print("error: no question is in every input", file=sys.stderr)
        return 2
    page = write(columns, table, args.out)
    print(f"wrote {page} ({table['questions']} questions x {len(columns)} columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
