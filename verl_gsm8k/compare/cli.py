"""Compare two or more runs: ``python -m verl_gsm8k.report RUN_A RUN_B [RUN_C ...] [--out DIR]``.

The run report's command line (verl_gsm8k/report/cli.py) hands over here when it is given more
than one INPUT. Each INPUT is what the run report reads (a run directory, a metrics .jsonl, a
verl console log). Writes DIR/comparison.html (one offline page) and DIR/summary.json beside
it, DIR being ./comparison by default; both are rendered before either is written, and each is
replaced atomically.

Modules of verl_gsm8k/compare/: config (where a run's config comes from), diff (the config
diff), runs (reading the runs, their x axes and table), charts (overlaid curves), page (the
HTML); this file builds the summary, writes, and prints the digest.

Exit status: 0 written; 1 cannot write; 2 bad input (a missing path, a run without metrics, the
same run twice, runs without a metric in common, an unreadable launch record): one line on
stderr and nothing written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.evals import evals_summary
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import VALIDATION_DIR
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.compare.charts import CHARTS
from verl_gsm8k.compare.diff import NAMED, ConfigDiff, config_diff
from verl_gsm8k.compare.page import render_page
from verl_gsm8k.compare.runs import (
    AXES,
    CompareError,
    Run,
    load_runs,
    metrics_in_some_runs,
    shared_metrics,
    table,
)
from verl_gsm8k.questions.runs import write_for_runs
from verl_gsm8k.runpage.html import duration
from verl_gsm8k.runpage.summary import json_safe

PROG = "verl_gsm8k.report"
DEFAULT_OUT = Path("comparison")
HTML_NAME = "comparison.html"
SUMMARY_NAME = "summary.json"


def _x_values(run: Run) -> dict[str, list[float | None] | None]:
    """Each of the run's steps on every axis (None for an axis the run cannot be placed on)."""
    steps = run.canon.all_steps
    out: dict[str, list[float | None] | None] = {"step": [float(s) for s in steps]}
    for axis, key in (("samples", "samples"), ("wall_time", "wall_time_s")):
        out[key] = None if run.why_not(axis) else [run.x(axis, s) for s in steps]
    return out


def build_summary(runs: Sequence[Run], diff: ConfigDiff) -> dict[str, Any]:
    """summary.json: the table, checks, config diff and curves of every run."""
    return {
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "inputs": [str(run.path) for run in runs],
        "axes": {
            "step": AXES["step"],
            "samples": AXES["samples"],
            "wall_time_s": AXES["wall_time"],
        },
        "runs": [
            {
                "label": run.label,
                "input": str(run.path),
                "sources": run.data.sources,
                "formats": sorted(set(run.data.formats)),
                "config_source": run.config.source,
                "table": table(run),
                "health": run.summary["health"],
                "health_counts": run.summary["health_counts"],
                "parse_issues": run.summary["parse_issues"],
                "checkpoint_evals": evals_summary(run.evals, run.canon.series.get("val_acc", [])),
                "x": {"steps": run.canon.all_steps, **_x_values(run)},
            }
            for run in runs
        ],
        "curves": {
            chart.metric: {
                run.label: run.canon.series[chart.metric]
                for run in runs
                if chart.metric in run.canon.series
            }
            for chart in CHARTS
        },
        "config_diff": {
            "compared": diff.compared,
            "not_compared": diff.not_compared,
            "groups": {
                group: [asdict(row) for row in rows] for group, rows in diff.by_group().items()
            },
        },
        "shared_metrics": shared_metrics(runs),
        "metrics_in_some_runs": metrics_in_some_runs(runs),
    }


def terminal_text(summary: dict[str, Any], out_dir: Path | None) -> str:
    """The digest: one line per run, the keys that differ, the files written."""
    lines = [f"Compared: {', '.join(r['label'] for r in summary['runs'])}"]
    for run in summary["runs"]:
        t = run["table"]
        best = t["val_best"]
        best_text = f"{best['value']:.4g} at step {best['step']}" if best else "n/a"
        tokens = f"{t['tokens_per_s']:.0f}" if t["tokens_per_s"] else "n/a"
        lines.append(
            f"  {run['label']}: best val accuracy {best_text}; {t['steps']} steps, "
            f"wall time {duration(t['wall_time_s'])}, tokens/s {tokens}"
        )
    diff = summary["config_diff"]
    groups = diff["groups"]
    keys = [row["key"] for group, rows in groups.items() if group != NAMED for row in rows]
    if len(diff["compared"]) >= 2:
        shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
        named = len(groups.get(NAMED, []))
        if named:
            shown = f"{shown or 'no setting'}; {named} keys named after the run"
        lines.append(f"  config diff: {shown or 'the configs are the same'}")
    for label, why in diff["not_compared"].items():
        lines.append(f"  config of {label} not compared: {why}")
    if out_dir is not None:
        lines.append(f"  written: {out_dir / HTML_NAME}, {out_dir / SUMMARY_NAME}")
    return "\n".join(clean(line) for line in lines)  # the runs' text, escaped


def compare(paths: Sequence[Path], out_dir: Path, step: str = "last") -> dict[str, Any]:
    """Read, render and write the comparison; returns its summary. ``step``: which validation
    step of each run the questions page shows (last or best).

    Raises CompareError (bad input: nothing written) or OSError (cannot write).
    """
    runs = load_runs(paths)
    diff = config_diff({run.label: run.config for run in runs})
    summary = build_summary(runs, diff)
    # each run's last (or best) validation step, question by question (verl_gsm8k/questions)
    questions, issue = (None, None)
    if all((run.path / VALIDATION_DIR).is_dir() for run in runs):
        questions, issue = write_for_runs([run.path for run in runs], out_dir, step)
    summary["questions_page"] = questions.relative_to(out_dir).as_posix() if questions else None
    summary["questions_issue"] = issue
    summary["questions_step"] = step
    page = render_page(runs, summary, diff)
    payload = json.dumps(json_safe(summary), indent=2, allow_nan=False, default=str) + "\n"
    write_atomic(out_dir / SUMMARY_NAME, payload)
    write_atomic(out_dir / HTML_NAME, page)
    return summary


def main(paths: Sequence[Path], out: Path | None, quiet: bool, step: str = "last") -> int:
    """The comparison's command line, after the run report's parser."""
    out_dir = out if out is not None else DEFAULT_OUT
    try:
        summary = compare(paths, out_dir, step)
    except CompareError as exc:
        print(f"{PROG}: error: {clean(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: cannot write the comparison to {out_dir}: {exc}", file=sys.stderr)
        return 1
    for run in summary["runs"]:
        for issue in run["parse_issues"]:
            print(f"{PROG}: warning: {clean(issue)}", file=sys.stderr)
    if summary["questions_issue"]:
        print(f"{PROG}: warning: {clean(summary['questions_issue'])}", file=sys.stderr)
    print(out_dir / HTML_NAME if quiet else terminal_text(summary, out_dir))
    return 0
