"""python -m verl_gsm8k.report RUN_A RUN_B [...]: DIR/comparison.html and summary.json, both
rendered before either is written. Exit status: 0 written; 1 cannot write; 2 bad input (one
line on stderr, nothing written)."""

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.evals import evals_summary
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import VALIDATION_DIR
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.compare.config import NAMED, ConfigDiff, config_diff
from verl_gsm8k.compare.page import CHARTS, render_page
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
from verl_gsm8k.svgplot.page import generated_at

PROG = "verl_gsm8k.report"
DEFAULT_OUT = Path("comparison")
HTML_NAME = "comparison.html"
SUMMARY_NAME = "summary.json"


def _run(run: Run) -> dict[str, Any]:
    """A run in summary.json, each step on every axis (null where it cannot be drawn)."""
    steps = run.canon.all_steps
    x = {"steps": steps, "step": [float(s) for s in steps]}
    for axis, key in (("samples", "samples"), ("wall_time", "wall_time_s")):
        x[key] = None if run.why_not(axis) else [run.x(axis, s) for s in steps]
    s = run.summary
    return {"label": run.label, "input": str(run.path), "sources": run.data.sources,
            "formats": sorted(set(run.data.formats)), "config_source": run.config.source,
            "table": table(run), "health": s["health"], "health_counts": s["health_counts"],
            "parse_issues": s["parse_issues"],
            "checkpoint_evals": evals_summary(run.evals, run.canon.series.get("val_acc", [])),
            "x": x}  # fmt: skip


def build_summary(runs: Sequence[Run], diff: ConfigDiff) -> dict[str, Any]:
    curves = {metric: {r.label: r.canon.series[metric] for r in runs if metric in r.canon.series}
              for _, _, metric, _, _ in CHARTS}  # fmt: skip
    groups = {group: [asdict(row) for row in rows] for group, rows in diff.by_group().items()}
    return {
        "generated_at": generated_at(), "inputs": [str(r.path) for r in runs],
        "axes": {"step": AXES["step"], "samples": AXES["samples"],
                 "wall_time_s": AXES["wall_time"]},
        "runs": [_run(r) for r in runs], "curves": curves,
        "config_diff": {"compared": diff.compared, "not_compared": diff.not_compared,
                        "groups": groups},
        "shared_metrics": shared_metrics(runs), "metrics_in_some_runs": metrics_in_some_runs(runs),
    }  # fmt: skip


def terminal_text(summary: dict[str, Any], out_dir: Path | None) -> str:
    lines = [f"Compared: {', '.join(r['label'] for r in summary['runs'])}"]
    for run in summary["runs"]:
        t, best = run["table"], run["table"]["val_best"]
        best = f"{best['value']:.4g} at step {best['step']}" if best else "n/a"
        tokens = f"{t['tokens_per_s']:.0f}" if t["tokens_per_s"] else "n/a"
        lines.append(f"  {run['label']}: best val accuracy {best}; {t['steps']} steps, wall "
                     f"time {duration(t['wall_time_s'])}, tokens/s {tokens}")  # fmt: skip
    diff, groups = summary["config_diff"], summary["config_diff"]["groups"]
    keys = [row["key"] for group, rows in groups.items() if group != NAMED for row in rows]
    if len(diff["compared"]) >= 2:
        shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
        if named := len(groups.get(NAMED, [])):
            shown = f"{shown or 'no setting'}; {named} keys named after the run"
        lines.append(f"  config diff: {shown or 'the configs are the same'}")
    lines += [f"  config of {k} not compared: {v}" for k, v in diff["not_compared"].items()]
    if out_dir is not None:
        lines.append(f"  written: {out_dir / HTML_NAME}, {out_dir / SUMMARY_NAME}")
    return "\n".join(clean(line) for line in lines)


def compare(paths: Sequence[Path], out_dir: Path, step: str = "last") -> dict[str, Any]:
    """Read, render and write the comparison and its questions page."""
    runs = load_runs(paths)
    diff = config_diff({run.label: run.config for run in runs})
    summary = build_summary(runs, diff)
    questions, issue = None, None
    if all((run.path / VALIDATION_DIR).is_dir() for run in runs):
        questions, issue = write_for_runs([run.path for run in runs], out_dir, step)
    summary.update(questions_page=questions.relative_to(out_dir).as_posix() if questions else
                   None, questions_issue=issue, questions_step=step)  # fmt: skip
    page = render_page(runs, summary, diff)
    payload = json.dumps(json_safe(summary), indent=2, allow_nan=False, default=str) + "\n"
    write_atomic(out_dir / SUMMARY_NAME, payload)
    write_atomic(out_dir / HTML_NAME, page)
    return summary


def main(paths: Sequence[Path], out: Path | None, quiet: bool, step: str = "last") -> int:
    out_dir = out or DEFAULT_OUT
    try:
        summary = compare(paths, out_dir, step)
    except CompareError as err:
        print(f"{PROG}: error: {clean(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"{PROG}: error: cannot write the comparison to {out_dir}: {clean(err)}",
              file=sys.stderr)  # fmt: skip
        return 1
    warnings = [i for r in summary["runs"] for i in r["parse_issues"]]
    for issue in warnings + [summary["questions_issue"]] * bool(summary["questions_issue"]):
        print(f"{PROG}: warning: {clean(issue)}", file=sys.stderr)
    print(out_dir / HTML_NAME if quiet else terminal_text(summary, out_dir))
    return 0
