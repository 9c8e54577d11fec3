"""The report's digest for the terminal, and the names of the files the report writes."""

from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.guard_records import best_text, trip_line
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.runpage.html import counts_text, duration, final_val_text, memory_text

HTML_NAME = "report.html"
SUMMARY_NAME = "summary.json"
PAGES = {"replay": "replay (per token)", "rollouts": "rollout browser",
         "questions": "questions page"}  # fmt: skip


def terminal_summary(summary: dict[str, Any], out_dir: Path | None) -> str:
    steps, val, tm, thr = (summary[k] for k in ("steps", "validation", "time", "throughput"))
    gaps = f", gaps before steps {steps['gaps_before'][:5]}" if steps["gaps_before"] else ""
    lines = [("Run", ", ".join(summary["sources"])),
             ("steps", f"{steps['count']} ({steps['first']}-{steps['last']}){gaps}")]  # fmt: skip
    best, first = val["best"], val["first"]
    if best:
        again = f" (again at {', '.join(map(str, best['also_at']))})" if best["also_at"] else ""
        lines += [("first val accuracy", f"{first['value']:.4g} at step {first['step']}"),
                  ("best val accuracy", f"{best['value']:.4g} at step {best['step']}{again}"),
                  ("final val accuracy", final_val_text(val, "at"))]  # fmt: skip
        if val["problems"]:
            lines.append(("val problems", f"{val['problems']} ({val['problems_from']})"))
    else:
        lines.append(("validation accuracy", "not logged"))
    score = summary["train_score"]
    if score["final_median_10"] is not None:
        lines.append(("train score", f"median of first 10 steps {score['first_median_10']:.4g}, "
                      f"of last 10 steps {score['final_median_10']:.4g}"))  # fmt: skip
    wall, inside = tm["wall_clock_s"], tm["step_time_total_s"]
    lines.append(("wall-clock (logged)", f"{duration(wall)} ({wall:.0f} s: steps {inside:.0f} s"
                  f" + outside the step timer {wall - inside:.0f} s)"))  # fmt: skip
    rate = f"{thr['tokens_per_s']:.0f} ({thr['basis']})" if thr["tokens_per_s"] else None
    lines.append(("tokens/s", rate or "n/a (not logged)"))
    if tm["phases"]:
        share = " | ".join(f"{k} {v['share'] * 100:.1f}%" for k, v in tm["phases"].items())
        lines.append(("time share", share))
    lines.append(("peak GPU memory", memory_text(summary["memory"])))
    evals = summary.get("checkpoint_evals")
    if evals and evals["rows"]:
        lines.append(("checkpoint evals", f"{len(evals['rows'])} ({evals['agreement_text']})"))
    lines += [("watchdog trip", trip_line(t)) for t in summary.get("watchdog_trips") or []]
    if summary.get("best_checkpoint"):
        lines.append(("kept best checkpoint", best_text(summary["best_checkpoint"])))
    lines.append(("health", counts_text(summary["health_counts"])))
    text = [f"{k}: {v}" if k == "Run" else f"  {k:<20}: {v}" for k, v in lines]
    text += [f"    [{f['severity']}] {f['check']} steps {f['start_step']}-{f['end_step']}: "
             f"{f['message']}" for f in summary["health"]]  # fmt: skip
    if out_dir is not None:
        text.append(f"  {'written':<20}: {out_dir / HTML_NAME}, {out_dir / SUMMARY_NAME}")
        pages = summary.get("pages") or {}
        text += [f"  {what:<20}: {out_dir / pages[k]}" for k, what in PAGES.items() if pages.get(k)]
    return "\n".join(clean(line) for line in text)
