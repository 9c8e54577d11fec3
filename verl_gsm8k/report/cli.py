"""Turn verl PPO/GRPO training metrics into a self-contained HTML report and a summary.json.

    python -m verl_gsm8k.report RUN_DIR_OR_FILE [--out DIR] [--follow [--interval S]]
    python -m verl_gsm8k.report RUN_A RUN_B [RUN_C ...] [--out DIR]    # a run comparison

With two or more inputs this hands over to the run comparison (verl_gsm8k/compare/cli.py).

INPUT is a run directory (``metrics/metrics-<UTC timestamp>.jsonl`` segments, one per launch),
one verl file-logger JSONL file, or a verl console log. Both the verl 0.9.1 metric names and the
older ones (``timing/...``, ``val/test_score/...``) are understood. Standard library only: the
plots are SVG drawn by verl_gsm8k/svgplot/, so the HTML needs nothing else to open.

This package is the entry point on top of the pages: it chooses them from the inputs and
imports each page's package, never the other way round (verl_gsm8k/__init__.py, LAYERS). One
run: the replay and rollout pages (verl_gsm8k/replay), the questions page (verl_gsm8k/questions)
and the report itself (verl_gsm8k/runpage: summary.json, report.html, the terminal digest),
from a run read and checked by verl_gsm8k/analysis. Several runs: verl_gsm8k/compare.

Exit status: 0 when a report was written (health findings do not change it), 1 when nothing at
all could be read or the report could not be written, 2 when INPUT does not exist.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.analysis.evals import evals_summary, read_checkpoint_evals
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import REPORT_DIR, VALIDATION_DIR
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.compare import cli as compare_cli
from verl_gsm8k.questions.runs import STEPS as QUESTION_STEPS
from verl_gsm8k.questions.runs import write_for_runs
from verl_gsm8k.replay.load import load_trace
from verl_gsm8k.replay.pages import write_pages
from verl_gsm8k.runpage import summary as rs
from verl_gsm8k.runpage.digest import HTML_NAME, SUMMARY_NAME, terminal_summary
from verl_gsm8k.runpage.html import render_html

PROG = "verl_gsm8k.report"

# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def default_out_dir(input_path: Path) -> Path:
    """<run_dir>/report for a directory, <name>-report beside a file."""
    if input_path.is_dir():
        return input_path / REPORT_DIR
    return input_path.parent / f"{input_path.stem}-report"


@dataclass
class Result:
    """What one report generation produced."""

    summary: dict[str, Any]
    out_dir: Path
    issues: list[str]


class NothingReadError(Exception):
    """No metric at all could be read from the input."""


def generate(input_path: Path, out_dir: Path, refresh_s: int | None = None) -> Result:
    """Read, analyse and write report.html + summary.json (both rendered before either is written).

    Raises rp.InputError (missing input), NothingReadError, or OSError (cannot write).
    """
    trace = load_trace(input_path) if input_path.is_dir() else None
    data, canon, findings, summary = rs.analyse(input_path, trace=trace)
    issues = [str(issue) for issue in data.issues]
    if not data.steps:
        detail = f" ({issues[0]})" if issues else ""
        raise NothingReadError(f"no metrics could be read from {input_path}{detail}")
    evals = read_checkpoint_evals(input_path) if input_path.is_dir() else None
    if evals is not None and evals.problem:
        issue = rp.ParseIssue(str(evals.path), None, evals.problem)
        data.issues.append(issue)
        issues.append(str(issue))
    out_dir.mkdir(parents=True, exist_ok=True)
    # the replay and the rollout browser of a run directory, beside the report (verl_gsm8k/replay)
    pages = write_pages(input_path, trace, out_dir) if trace is not None else None
    # which questions changed across the validation steps (verl_gsm8k/questions)
    questions, questions_issue = (None, None)
    if input_path.is_dir() and (input_path / VALIDATION_DIR).is_dir():
        questions, questions_issue = write_for_runs([input_path], out_dir)
    summary = {
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "input": str(input_path),
        **summary,
        "val_acc_by_step": canon.series.get("val_acc", []),
        "checkpoint_evals": evals_summary(evals, canon.series.get("val_acc", [])),
        "pages": {
            "replay": pages.replay.name if pages and pages.replay else None,
            "rollouts": pages.rollouts.name if pages and pages.rollouts else None,
            "questions": questions.relative_to(out_dir).as_posix() if questions else None,
            "issues": (pages.issues if pages else []) + [questions_issue] * bool(questions_issue),
        },
    }
    issues += summary["pages"]["issues"]
    page = render_html(input_path.name, data, canon, findings, summary, refresh_s, evals)
    payload = json.dumps(rs.json_safe(summary), indent=2, allow_nan=False) + "\n"
    write_atomic(out_dir / SUMMARY_NAME, payload)
    write_atomic(out_dir / HTML_NAME, page)
    return Result(summary, out_dir, issues)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description=(
            "Build a self-contained HTML report (plots, health checks, time breakdown) and a "
            "summary.json from verl PPO/GRPO training metrics, and print a short summary."
        ),
        epilog=(
            "Exit status: 0 report written; 1 nothing readable or cannot write; 2 no INPUT (a "
            "comparison: 2 for any input it cannot compare, and nothing is written)."
        ),
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        type=Path,
        help=(
            "run directory (its metrics/*.jsonl segments are merged in name order, a later "
            "segment winning on overlapping steps), one verl file-logger .jsonl file, or a verl "
            "console log with 'step:N - key:value' lines. Two or more INPUTs: one page "
            "comparing the runs (curves by step, samples seen or wall time, a table, the config "
            "diff, the health checks side by side)"
        ),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "directory for report.html and summary.json (default: INPUT/report for a run "
            "directory, <name>-report next to a file); with two or more INPUTs, for "
            f"{compare_cli.HTML_NAME} and {compare_cli.SUMMARY_NAME} (default: "
            f"./{compare_cli.DEFAULT_OUT}); files are replaced atomically"
        ),
    )
    parser.add_argument(
        "--step",
        choices=[step for step in QUESTION_STEPS if step != "all"],
        default="last",
        help=(
            "with two or more INPUTs: the validation step of each run its questions page "
            "compares, the last (default) or the best (highest accuracy, the earliest of equals)"
        ),
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep re-reading INPUT and regenerating the report while a run goes on (Ctrl-C stops)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds between refreshes with --follow (default: 60)",
    )
    parser.add_argument(
        "--max-refreshes",
        type=int,
        default=None,
        metavar="N",
        help="with --follow, stop after N report generations (default: until interrupted)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only errors and the output paths"
    )
    return parser


def _err(message: str) -> None:
    print(f"{PROG}: error: {clean(message)}", file=sys.stderr)


@dataclass
class Failure:
    """Why one report generation wrote nothing: exit status and a few words for --follow."""

    code: int
    reason: str


def _run_once(args: argparse.Namespace, out_dir: Path, refresh_s: int | None) -> Result | Failure:
    try:
        return generate(args.input, out_dir, refresh_s)
    except rp.InputError as exc:
        _err(str(exc))
        gone = not args.input.exists()
        return Failure(2, f"input {args.input} is gone" if gone else "no metric files found")
    except NothingReadError as exc:
        _err(str(exc))
        return Failure(1, "no metrics could be read")
    except OSError as exc:
        _err(f"cannot write the report to {out_dir}: {exc} (earlier report left as it was)")
        return Failure(1, f"cannot write to {out_dir}")


def _not_written(refresh: int, failure: Failure, page: Path) -> str:
    """The --follow progress line of a refresh that wrote nothing, saying what is on disk."""
    if page.is_file():
        return f"refresh {refresh}: {failure.reason}; the last report at {page} is kept"
    return f"refresh {refresh}: nothing written yet ({failure.reason})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(args.inputs) > 1:
        if args.follow:
            _err("--follow reads one INPUT; a comparison is written once")
            return 2
        return compare_cli.main(args.inputs, args.out, args.quiet, args.step)
    args.input = args.inputs[0]
    if not args.input.exists():
        _err(f"input not found: {args.input}")
        return 2
    if args.interval <= 0:
        _err("--interval must be > 0")
        return 2
    if args.max_refreshes is not None and args.max_refreshes < 1:
        _err("--max-refreshes must be >= 1")
        return 2
    out_dir = args.out if args.out is not None else default_out_dir(args.input)

    if not args.follow:
        result = _run_once(args, out_dir, None)
        if isinstance(result, Failure):
            return result.code
        for issue in result.issues:
            print(f"{PROG}: warning: {clean(issue)}", file=sys.stderr)
        if args.quiet:
            print(out_dir / HTML_NAME)
        else:
            print(terminal_summary(result.summary, out_dir))
        return 0

    refresh_s = max(1, int(math.ceil(args.interval)))
    refreshes = 0
    last: Result | None = None
    last_code = 1
    shown_issues: set[str] = set()
    try:
        while True:
            outcome = _run_once(args, out_dir, refresh_s)
            refreshes += 1
            stamp = datetime.now().strftime("%H:%M:%S")
            if isinstance(outcome, Failure):
                last_code = outcome.code
                print(
                    f"[{stamp}] {_not_written(refreshes, outcome, out_dir / HTML_NAME)}", flush=True
                )
            else:
                last, last_code = outcome, 0
                for issue in outcome.issues:
                    if issue not in shown_issues:
                        print(f"{PROG}: warning: {clean(issue)}", file=sys.stderr)
                shown_issues = set(outcome.issues)
                s = outcome.summary
                best = s["validation"]["best"]
                best_text = f"best val {best['value']:.4g} @ {best['step']}" if best else "no val"
                c = s["health_counts"]
                print(
                    f"[{stamp}] refresh {refreshes}: {s['steps']['count']} steps (last "
                    f"{s['steps']['last']}), {best_text}, {c['error']} errors / {c['warning']} "
                    f"warnings -> {out_dir / HTML_NAME}",
                    flush=True,
                )
            if args.max_refreshes is not None and refreshes >= args.max_refreshes:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print("\nstopped.", file=sys.stderr)
    if last is not None and not args.quiet:
        print(terminal_summary(last.summary, out_dir))
    return 0 if last is not None else last_code
