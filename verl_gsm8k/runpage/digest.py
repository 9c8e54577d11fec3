"""The run report's digest for the terminal, and the names of the files the report writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.guard_records import best_text, trip_line
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.runpage.html import duration, final_val_text, memory_text

HTML_NAME = "report.html"
SUMMARY_NAME = "summary.json"


def terminal_summary(summary: dict[str, Any], out_dir: Path | None) -> str:
    """Plain-text digest for the terminal."""
    steps = summary["steps"]
    val = summary["validation"]
    tm = summary["time"]
    thr = summary["throughput"]
    lines = [
        f"Run: {', '.join(summary['sources'])}",
        f"  steps               : {steps['count']} ({steps['first']}-{steps['last']})"
        + (f", gaps before steps {steps['gaps_before'][:5]}" if steps["gaps_before"] else ""),
    ]
    best, first = val["best"], val["first"]
    if best:
        also = f" (again at {', '.join(map(str, best['also_at']))})" if best["also_at"] else ""
        lines.append(f"  first val accuracy  : {first['value']:.4g} at step {first['step']}")
        lines.append(f"  best val accuracy   : {best['value']:.4g} at step {best['step']}{also}")
        lines.append(f"  final val accuracy  : {final_val_text(val, 'at')}")
        if val["problems"]:
            lines.append(f"  val problems        : {val['problems']} ({val['problems_from']})")
    else:
        lines.append("  validation accuracy : not logged")
    score = summary["train_score"]
    if score["final_median_10"] is not None:
        lines.append(
            f"  train score         : median of first 10 steps {score['first_median_10']:.4g}, "
            f"of last 10 steps {score['final_median_10']:.4g}"
        )
    lines.append(
        f"  wall-clock (logged) : {duration(tm['wall_clock_s'])} ({tm['wall_clock_s']:.0f} s: "
        f"steps {tm['step_time_total_s']:.0f} s + outside the step timer "
        f"{tm['wall_clock_s'] - tm['step_time_total_s']:.0f} s)"
    )
    if thr["tokens_per_s"]:
        lines.append(f"  tokens/s            : {thr['tokens_per_s']:.0f} ({thr['basis']})")
    else:
        lines.append("  tokens/s            : n/a (not logged)")
    if tm["phases"]:
        share = " | ".join(f"{k} {v['share'] * 100:.1f}%" for k, v in tm["phases"].items())
        lines.append(f"  time share          : {share}")
    lines.append(f"  peak GPU memory     : {memory_text(summary['memory'])}")
    evals = summary.get("checkpoint_evals")
    if evals and evals["rows"]:
        lines.append(f"  checkpoint evals    : {len(evals['rows'])} ({evals['agreement_text']})")
    for trip in summary.get("watchdog_trips") or []:
        lines.append(f"  watchdog trip       : {trip_line(trip)}")
    if summary.get("best_checkpoint"):
        lines.append(f"  kept best checkpoint: {best_text(summary['best_checkpoint'])}")
    counts = summary["health_counts"]
    lines.append(
        f"  health              : {counts['error']} errors, {counts['warning']} warnings, "
        f"{counts['note']} notes"
    )
    for finding in summary["health"]:
        lines.append(
            f"    [{finding['severity']}] {finding['check']} steps {finding['start_step']}-"
            f"{finding['end_step']}: {finding['message']}"
        )
    if out_dir is not None:
        lines.append(f"  written             : {out_dir / HTML_NAME}, {out_dir / SUMMARY_NAME}")
        pages = summary.get("pages") or {}
        for key, what in (
            ("replay", "replay (per token)"),
            ("rollouts", "rollout browser"),
            ("questions", "questions page"),
        ):
            if pages.get(key):
                lines.append(f"  {what:<20}: {out_dir / pages[key]}")
    return "\n".join(clean(line) for line in lines)  # text of the run directory, escaped
