"""report.html: the whole report in one page, its charts inline SVG."""

from html import escape
from typing import Any

from verl_gsm8k.analysis.evals import EvalFile, eval_series
from verl_gsm8k.analysis.finding import Finding
from verl_gsm8k.analysis.guard_records import best_text, healthy_text
from verl_gsm8k.analysis.parse import Canonical
from verl_gsm8k.common.run_dir import WATCHDOG_FILE
from verl_gsm8k.runpage.plots import build_plots, render_phase_plot, render_share_bar
from verl_gsm8k.runpage.summary import time_breakdown
from verl_gsm8k.svgplot.chart import PALETTE, Line, Plot, render_line_plot
from verl_gsm8k.svgplot.page import Raw, page, table

LINKS = {"replay": "one iteration, replayed token by token",
         "rollouts": "every rollout and validation answer",
         "questions": "which questions changed across validation steps"}  # fmt: skip


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m {rest % 60:02d}s"


def num(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "n/a" if value is None else str(value)


def memory_text(memory: dict[str, Any]) -> str:
    parts = []
    for role, peak in memory["gpu"].items():
        used, held = peak["allocated"], peak["reserved"]
        text = f"{role} {used['gb']:.1f} GiB" if used else f"{role} n/a"
        parts.append(text + (f" (reserved {held['gb']:.1f})" if held else ""))
    host = memory["host_used"]
    if not parts:
        return "not logged"
    return ", ".join(parts) + (f"; host {host['gb']:.1f} GiB in use" if host else "")


def final_val_text(val: dict[str, Any], at: str = "@") -> str:
    final, sick = val["final"], val.get("not_finite_steps") or []
    text = f"{final['value']:.4g} {at} step {final['step']}" if final else "n/a"
    if sick and (final is None or sick[-1] > final["step"]):
        return f"NaN {at} step {sick[-1]}" + (f" (last finite: {text})" if final else "")
    return text


def counts_text(c: dict[str, int]) -> str:
    return f"{c['error']} errors, {c['warning']} warnings, {c['note']} notes"


def _cards(summary: dict[str, Any]) -> list[str]:
    val, steps, thr = summary["validation"], summary["steps"], summary["throughput"]
    best = val["best"]
    cards = {
        "best validation accuracy": f"{best['value']:.4g} @ step {best['step']}" if best else "n/a",
        "final validation accuracy": final_val_text(val),
        "steps": f"{steps['count']} ({steps['first']}-{steps['last']})" if steps["count"] else "0",
        "logged wall-clock": duration(summary["time"]["wall_clock_s"]),
        "tokens/s" + " (estimated)" * thr["estimated"]:
            f"{thr['tokens_per_s']:.0f}" if thr["tokens_per_s"] else "n/a",
        "peak GPU memory": memory_text(summary["memory"]),
        "health": counts_text(summary["health_counts"]),
    }  # fmt: skip
    if summary.get("best_checkpoint"):
        cards["kept best checkpoint"] = f"step {summary['best_checkpoint']['step']}"
    items = [f'<div class="card">{escape(k)}<b>{escape(v)}</b></div>' for k, v in cards.items()]
    return [f'<div class="cards">{"".join(items)}</div>']


def _guard(summary: dict[str, Any], findings: list[Finding]) -> list[str]:
    out = [f'<p id="turned" class="sev-error">{escape(f.message)}</p>'
           for f in findings if f.check == "non_finite"][:1]  # fmt: skip
    rows = []
    for t in summary.get("watchdog_trips") or []:
        rows.append([t["step"], t.get("rule"), t.get("metric"), t["value_text"], t.get("threshold"),
                     t.get("action"), healthy_text(t), t.get("launch")])  # fmt: skip
    if rows:
        head = ["step", "rule", "metric", "value", "threshold", "action",
                "last healthy checkpoint", "launch"]  # fmt: skip
        out += ["<h2>Watchdog trips</h2>",
                table(head, rows, ' id="watchdog-trips"', ' class="trip"'),
                f'<p class="meta">From the run\'s <code>{WATCHDOG_FILE}</code>; a stopped run '
                "resumes with the same command from the last healthy checkpoint, or merge that "
                "one (<code>docs/reliability.md</code>).</p>"]  # fmt: skip
    best, problem = summary.get("best_checkpoint"), summary.get("best_checkpoint_problem")
    if best:
        out.append(f'<p id="best-checkpoint">Kept best checkpoint: <b>{escape(best_text(best))}'
                   "</b>; merge it with <code>bash scripts/merge.sh RUN_DIR OUT --best</code>."
                   "</p>")  # fmt: skip
    elif problem:
        out.append(f'<p id="best-checkpoint" class="sev-warning">{escape(problem)}</p>')
    return out


def _health(findings: list[Finding], issues: list[str], pages: dict[str, Any]) -> list[str]:
    links = [f'<a id="{k}-link" href="{escape(pages[k])}">{v}</a>' for k, v in LINKS.items()
             if pages.get(k)]  # fmt: skip
    out = [f'<p class="meta">{escape(issue)}</p>' for issue in pages.get("issues", [])]
    if links or out:
        out.insert(0, "<h2>Look inside</h2><p>" + (" &middot; ".join(links) or "no page") + "</p>")
    rows = [[Raw(f'<span class="sev-{f.severity}">{f.severity}</span>'), f.check, f.metric,
             f"{f.start_step}-{f.end_step}", f.message] for f in findings]  # fmt: skip
    head = ["severity", "check", "metric", "steps", "what triggered it"]
    out += ["<h2>Health checks</h2>",
            table(head, rows, ' id="health"', ' class="finding"') if rows
            else '<p class="ok">No check fired.</p>',
            '<p class="meta">What each check means and what to change: <code>docs/'
            "reading-a-ppo-run.md</code>. Thresholds are listed at the end.</p>"]  # fmt: skip
    if issues:
        items = "".join(f"<li><code>{escape(i)}</code></li>" for i in issues)
        out.append(f"<h2>Input problems (the rest was used)</h2><ul>{items}</ul>")
    return out


def eval_plot(val: list[tuple[int, float]], evals: EvalFile) -> Plot:
    ours, lenient = eval_series(evals.rows)
    lines = [Line("verl validation (during training)", val, PALETTE[0], width=2.0),
             Line("our reward on the checkpoint", ours, PALETTE[1], dots=True, dashed=True),
             Line("EvalScope (lenient)", lenient, PALETTE[2], 1.0, True, dashed=True)]  # fmt: skip
    return Plot("checkpoint_eval", "Checkpoint evaluations: our reward vs verl's validation "
                "accuracy", lines, "accuracy", log_y=False)  # fmt: skip


def _evals(evals: EvalFile, canon: Canonical, info: dict[str, Any], span: tuple[float, float]
           ) -> list[str]:  # fmt: skip
    steps = [row.step for row in evals.rows]
    span = (min(span[0], *steps), max(span[1], *steps))
    val = canon.series.get("val_acc", [])
    rows = [[r.step, r.model, num(r.n), num(dict(val).get(r.step)),
             num(r.our_reward_accuracy), num(r.accuracy)] for r in evals.rows]  # fmt: skip
    head = ["step", "model", "n", "verl validation", "our reward", "EvalScope (lenient)"]
    return ["<h2>Checkpoint evaluations</h2>",
            f'<p class="meta">From <code>{escape(str(evals.path))}</code>. Our reward re-scores '
            "each checkpoint's answers as training scored them, so it should track verl's "
            "validation curve; EvalScope's lenient score reads answers more loosely. "
            f'<b id="eval-agreement">{escape(info["agreement_text"])}</b>.</p>',
            render_line_plot(eval_plot(val, evals), span),
            table(head, rows, ' id="checkpoint-evals"')]  # fmt: skip


def _time(summary: dict[str, Any]) -> list[str]:
    phases = summary["time"]["phases"]
    if not phases:
        return ["<h2>Where the time goes</h2><p>No timing metrics logged.</p>"]
    rows = [[name, duration(p["total_s"]), f"{p['share'] * 100:.1f}%",
             "inside the step timer" if p["inside_step"] else "outside (validation)"]
            for name, p in phases.items()]  # fmt: skip
    derived = ("Step time = sum of the phases (this log has no step timer)."
               if summary["time"]["step_time_derived"] else
               "Step time as logged (timing_s/step); 'other': what no phase covers.")  # fmt: skip
    basis = escape(summary["throughput"]["basis"])
    return ["<h2>Where the time goes</h2>", render_share_bar(phases),
            table(["phase", "total", "share", "timed"], rows),
            f'<p class="meta">{derived} Throughput: {basis}.</p>']  # fmt: skip


def render_html(title: str, canon: Canonical, findings: list[Finding],
                summary: dict[str, Any], refresh_s: int | None = None,
                evals: EvalFile | None = None) -> str:  # fmt: skip
    steps = canon.all_steps
    span = (float(min(steps)), float(max(steps))) if steps else (0.0, 1.0)
    sources = ", ".join(f"<code>{escape(src)}</code>" for src in summary["sources"])
    body = [f"<h1>PPO run report: {escape(title)}</h1>",
            f'<div class="meta">generated {escape(summary["generated_at"])} from {sources} '
            f"({escape('/'.join(summary['formats']))})</div>"]  # fmt: skip
    body += _cards(summary) + _guard(summary, findings)
    body += _health(findings, summary["parse_issues"], summary.get("pages") or {})
    body.append('<h2>Curves</h2><div class="grid">')
    body += [render_line_plot(plot, span) for plot in build_plots(canon, findings)]
    body += [render_phase_plot(canon, span, time_breakdown(canon)["other_by_step"]), "</div>"]
    if evals is not None and evals.rows:
        body += _evals(evals, canon, summary["checkpoint_evals"], span)
    body += _time(summary)
    metrics = [[name, m["label"], Raw(f"<code>{escape(str(m['key']))}</code>"), m["points"],
                num(m["first"]), num(m["median"]), num(m["last"])]
               for name, m in summary["metrics"].items()]  # fmt: skip
    thresholds = [[Raw(f"<code>{escape(k)}</code>"), v] for k, v in summary["thresholds"].items()]
    head = ["canonical", "meaning", "read from", "points", "first", "median", "last"]
    body += ["<h2>Metric names</h2>", table(head, metrics), "<h2>Thresholds</h2>",
             table(["name", "value"], thresholds)]  # fmt: skip
    return page(f"{title} - PPO run report", body, refresh=refresh_s)
