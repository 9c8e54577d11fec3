"""python -m verl_gsm8k.questions: the per-question comparison page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .page import write
from .runs import validation_steps
from .table import InputError, build, load_validation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.questions",
        description="One row per question, one column per validation dump: which changed.",
    )
    parser.add_argument(
        "dumps",
        nargs="*",
        type=Path,
        help="verl validation dumps <step>.jsonl, one column each, in order",
    )
    parser.add_argument(
        "--run",
        type=Path,
        action="append",
        default=[],
        help="a run directory: every RUN/validation/<step>.jsonl becomes a column (repeatable)",
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
        inputs: list[tuple[Path, str]] = [(p, p.stem) for p in args.dumps]
        for run in args.run:
            steps = validation_steps(run)
            if args.last_only:
                steps = steps[-1:]
            inputs += [(p, f"{run.name}:{p.stem}") for p in steps]
        if not inputs:
            parser.error("give validation dumps or --run RUN_DIR")
        columns = [load_validation(p, label) for p, label in inputs]
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = build(columns)
    if not table["questions"]:
        print("error: no question is in every input", file=sys.stderr)
        return 2
    page = write(columns, table, args.out)
    print(f"wrote {page} ({table['questions']} questions x {len(columns)} columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
