"""python -m verl_gsm8k.report INPUT [--out DIR] [--follow]: report.html, summary.json, a
digest and a run directory's replay, rollout and questions pages; two or more INPUTs: the run
comparison. Exit status: 0 written; 1 nothing readable, or cannot write; 2 no INPUT."""

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.evals import evals_summary, read_checkpoint_evals
from verl_gsm8k.analysis.parse import InputError
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import REPORT_DIR, VALIDATION_DIR
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.compare import cli as compare_cli
from verl_gsm8k.questions.runs import STEPS, write_for_runs
from verl_gsm8k.replay.load import load_trace
from verl_gsm8k.replay.pages import write_pages
from verl_gsm8k.runpage import summary as rs
from verl_gsm8k.runpage.digest import HTML_NAME, SUMMARY_NAME, terminal_summary
from verl_gsm8k.runpage.html import render_html
from verl_gsm8k.svgplot.page import generated_at

PROG = "verl_gsm8k.report"


def default_out_dir(path: Path) -> Path:
    return path / REPORT_DIR if path.is_dir() else path.parent / f"{path.stem}-report"


@dataclass
class Result:
    summary: dict[str, Any]
    out_dir: Path
    issues: list[str]


def generate(path: Path, out_dir: Path, refresh_s: int | None = None) -> Result:
    """Read, check and write report.html + summary.json (both rendered before either)."""
    run = path.is_dir()
    trace = load_trace(path) if run else None
    _, canon, findings, summary = rs.analyse(path, trace=trace)
    evals = read_checkpoint_evals(path) if run else None
    if evals and evals.problem:
        summary["parse_issues"].append(f"{evals.path}: {evals.problem}")
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = write_pages(path, trace, out_dir) if trace is not None else None
    questions, why = None, None
    if run and (path / VALIDATION_DIR).is_dir():
        questions, why = write_for_runs([path], out_dir)
    val = canon.series.get("val_acc", [])
    summary.update(
        generated_at=generated_at(), input=str(path),
        val_acc_by_step=val, checkpoint_evals=evals_summary(evals, val),
        pages={"replay": pages.replay.name if pages and pages.replay else None,
               "rollouts": pages.rollouts.name if pages and pages.rollouts else None,
               "questions": questions.relative_to(out_dir).as_posix() if questions else None,
               "issues": (pages.issues if pages else []) + [why] * bool(why)})  # fmt: skip
    html = render_html(path.name, canon, findings, summary, refresh_s, evals)
    payload = json.dumps(rs.json_safe(summary), indent=2, allow_nan=False) + "\n"
    write_atomic(out_dir / SUMMARY_NAME, payload)
    write_atomic(out_dir / HTML_NAME, html)
    return Result(summary, out_dir, summary["parse_issues"] + summary["pages"]["issues"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="An HTML report (plots, health checks, time per phase) and a summary.json "
        "of verl training metrics.",
        epilog="Exit status: 0 report written; 1 nothing readable or cannot write; 2 no INPUT "
        "(a comparison: 2 for any input it cannot compare, and nothing is written).",
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="INPUT", type=Path,
        help="run directory, one verl file-logger .jsonl, or a verl console log. Two or more "
        "INPUTs: one page comparing the runs",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, metavar="DIR",
        help="output directory (default: INPUT/report for a run directory, <name>-report beside "
        f"a file; ./{compare_cli.DEFAULT_OUT} for a comparison, its {compare_cli.HTML_NAME})",
    )  # fmt: skip
    parser.add_argument(
        "--step", choices=STEPS[1:], default="last",
        help="with two or more INPUTs: each run's validation step on the questions page",
    )  # fmt: skip
    parser.add_argument(
        "--follow",
        action="store_true",
        help="rewrite the report while a run goes on (Ctrl-C stops)",
    )
    parser.add_argument("--interval", type=float, default=60.0, metavar="S",
                        help="seconds between refreshes with --follow (default: 60)")  # fmt: skip
    parser.add_argument("--max-refreshes", type=int, metavar="N",
                        help="with --follow, stop after N reports (default: no end)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="print only errors and the page")
    return parser


def _err(message: object) -> None:
    print(f"{PROG}: error: {clean(message)}", file=sys.stderr)


def _once(path: Path, out_dir: Path, refresh_s: int | None) -> Result | tuple[int, str]:
    try:
        return generate(path, out_dir, refresh_s)
    except InputError as err:
        _err(err)
        return 2, f"input {path} is gone" if not path.exists() else "no metric files found"
    except rs.NothingReadError as err:
        _err(err)
        return 1, "no metrics could be read"
    except OSError as err:
        _err(f"cannot write the report to {out_dir}: {err} (earlier report left as it was)")
        return 1, f"cannot write to {out_dir}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    path = args.inputs[0]
    if len(args.inputs) > 1:
        if args.follow:
            _err("--follow reads one INPUT; a comparison is written once")
            return 2
        return compare_cli.main(args.inputs, args.out, args.quiet, args.step)
    checks = ((not path.exists(), f"input not found: {path}"),
              (args.interval <= 0, "--interval must be > 0"),
              ((args.max_refreshes or 1) < 1, "--max-refreshes must be >= 1"))  # fmt: skip
    for bad, message in checks:
        if bad:
            _err(message)
            return 2
    out_dir = args.out or default_out_dir(path)
    page = out_dir / HTML_NAME
    refreshes, last, code, shown = 0, None, 1, set()
    try:
        while True:
            refresh_s = max(1, math.ceil(args.interval)) if args.follow else None
            outcome = _once(path, out_dir, refresh_s)
            refreshes += 1
            if isinstance(outcome, Result):
                last, code = outcome, 0
                for issue in outcome.issues:
                    if issue not in shown:
                        print(f"{PROG}: warning: {clean(issue)}", file=sys.stderr)
                shown = set(outcome.issues)
            else:
                code = outcome[0]
            if not args.follow:
                break
            stamp = datetime.now().strftime("%H:%M:%S")
            if isinstance(outcome, Result):
                s, c = outcome.summary, outcome.summary["health_counts"]
                best = s["validation"]["best"]
                best = f"best val {best['value']:.4g} @ {best['step']}" if best else "no val"
                line = (f"{s['steps']['count']} steps (last {s['steps']['last']}), {best}, "
                        f"{c['error']} errors / {c['warning']} warnings -> {page}")  # fmt: skip
            elif page.is_file():
                line = f"{outcome[1]}; the last report at {page} is kept"
            else:
                line = f"nothing written yet ({outcome[1]})"
            print(f"[{stamp}] refresh {refreshes}: {line}", flush=True)
            if args.max_refreshes is not None and refreshes >= args.max_refreshes:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print("\nstopped.", file=sys.stderr)
    if last is not None and not (args.quiet and args.follow):
        print(page if args.quiet else terminal_summary(last.summary, out_dir))
    return 0 if last is not None else code
