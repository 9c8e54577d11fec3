"""The whole report as one self-contained HTML page (no scripts, stylesheets or images)."""

from __future__ import annotations

import html
from typing import Any

from verl_gsm8k.analysis import finding as rf
from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.analysis.evals import CheckpointEval, EvalFile, eval_series
from verl_gsm8k.analysis.guard_records import best_text, value_text
from verl_gsm8k.common.run_dir import WATCHDOG_FILE, step_name
from verl_gsm8k.runpage import summary as rs
from verl_gsm8k.runpage.plots import build_plots, render_phase_plot, render_share_bar
from verl_gsm8k.svgplot.chart import PALETTE, Line, Plot, render_line_plot

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1360px}
h1{font-size:1.4em;margin-bottom:4px} h2{font-size:1.15em;margin-top:28px}
.meta{color:#666;font-size:.9em}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}
.card b{display:block;font-size:1.25em}
.grid{display:flex;flex-wrap:wrap;gap:14px}
figure.chart{margin:0} figure.chart figcaption{font-weight:600;font-size:.95em;margin:0 0 4px}
svg.plot{display:block;border:1px solid #e4e4e4;border-radius:4px;background:#fafafa;font-size:11px}
.plot.missing{width:640px;height:80px;border:1px dashed #ccc;border-radius:4px;padding:10px;
color:#777;box-sizing:border-box}
table{border-collapse:collapse;font-size:.92em} td,th{border:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f4f4f4}
.sev-error{color:#b00;font-weight:bold} .sev-warning{color:#c60;font-weight:bold}
.sev-note{color:#1f5fa0} .ok{color:#2a7a2a;font-weight:bold}
code{background:#f4f4f4;padding:0 3px}
"""


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def memory_text(memory: dict[str, Any]) -> str:
    """Peak GPU memory per role in a few words: "actor 31.2 GiB (reserved 35.0), critic ..."."""
    parts = []
    for role, peaks in memory["gpu"].items():
        allocated, reserved = peaks["allocated"], peaks["reserved"]
        text = f"{role} {allocated['gb']:.1f} GiB" if allocated else f"{role} n/a"
        if reserved:
            text += f" (reserved {reserved['gb']:.1f})"
        parts.append(text)
    if not parts:
        return "not logged"
    host = memory["host_used"]
    return ", ".join(parts) + (f"; host {host['gb']:.1f} GiB in use" if host else "")


def num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def eval_plot(val: rp.Series, rows: list[CheckpointEval]) -> Plot:
    """verl's validation accuracy (line), our reward on each checkpoint (dashed, with dots) and
    EvalScope's lenient score (thin, dashed), on one chart."""
    ours, lenient = eval_series(rows)
    return Plot(
        "checkpoint_eval",
        "Checkpoint evaluations: our reward vs verl's validation accuracy",
        [
            Line("verl validation (during training)", val, PALETTE[0], width=2.0),
            Line("our reward on the checkpoint", ours, PALETTE[1], dots=True, dashed=True),
            Line("EvalScope (lenient)", lenient, PALETTE[2], width=1.0, dots=True, dashed=True),
        ],
        "accuracy",
        log_y=False,
    )


def _evals_section(
    evals: EvalFile, canon: rp.Canonical, info: dict[str, Any], x_range: tuple[float, float]
) -> list[str]:
    """The checkpoint evaluations drawn over verl's validation curve, and a table of both."""
    esc = html.escape
    steps = [row.step for row in evals.rows]
    x_range = (min(x_range[0], *steps), max(x_range[1], *steps))
    val = dict(canon.series.get("val_acc", []))
    out = [
        "<h2>Checkpoint evaluations</h2>",
        f'<p class="meta">From <code>{esc(str(evals.path))}</code>. Our reward re-scores each '
        "checkpoint's answers as training scored them, so it should track verl's validation "
        "curve; EvalScope's lenient score reads answers more loosely. "
        f'<b id="eval-agreement">{esc(info["agreement_text"])}</b>.</p>',
        render_line_plot(eval_plot(canon.series.get("val_acc", []), evals.rows), x_range),
        '<table id="checkpoint-evals"><tr><th>step</th><th>model</th><th>n</th>'
        "<th>verl validation</th><th>our reward</th><th>EvalScope (lenient)</th></tr>",
    ]
    for row in evals.rows:
        out.append(
            f"<tr><td>{row.step}</td><td>{esc(row.model)}</td><td>{num(row.n)}</td>"
            f"<td>{num(val.get(row.step))}</td><td>{num(row.our_reward_accuracy)}</td>"
            f"<td>{num(row.accuracy)}</td></tr>"
        )
    out.append("</table>")
    return out


def final_val_text(val: dict[str, Any], at: str = "@") -> str:
    """The final validation: a NaN one (a sick run) named as such, with the last finite one."""
    final, sick = val["final"], val.get("not_finite_steps") or []
    text = f"{final['value']:.4g} {at} step {final['step']}" if final else "n/a"
    if sick and (final is None or sick[-1] > final["step"]):
        return f"NaN {at} step {sick[-1]}" + (f" (last finite: {text})" if final else "")
    return text


def _guard_section(summary: dict[str, Any], findings: list[rf.Finding]) -> list[str]:
    """Where a sick run turned, the watchdog's trips and the kept best checkpoint, at the top."""
    esc = html.escape
    out: list[str] = []
    turned = [f for f in findings if f.check == "first_non_finite"]
    if turned:
        out.append(f'<p id="turned" class="sev-error">{esc(turned[0].message)}</p>')
    trips = summary.get("watchdog_trips") or []
    if trips:
        out += [
            "<h2>Watchdog trips</h2>",
            '<table id="watchdog-trips"><tr><th>step</th><th>rule</th><th>metric</th>'
            "<th>value</th><th>threshold</th><th>action</th><th>last healthy checkpoint</th>"
            "<th>launch</th></tr>",
        ]
        for trip in trips:
            healthy = trip.get("last_healthy_checkpoint")
            cells = (
                trip["step"],
                trip.get("rule"),
                trip.get("metric"),
                value_text(trip.get("value")),
                trip.get("threshold"),
                trip.get("action"),
                "none" if healthy is None else step_name(healthy),
                trip.get("launch"),
            )
            out.append('<tr class="trip">' + "".join(f"<td>{esc(str(c))}</td>" for c in cells)
                       + "</tr>")  # fmt: skip
        out.append(
            f'</table><p class="meta">From the run\'s <code>{WATCHDOG_FILE}</code>; a stopped run '
            "resumes with the same command from the last healthy checkpoint, or merge that one "
            "(<code>docs/reliability.md</code>).</p>"
        )
    best, problem = summary.get("best_checkpoint"), summary.get("best_checkpoint_problem")
    if best:
        out.append(
            f'<p id="best-checkpoint">Kept best checkpoint: <b>{esc(best_text(best))}</b>; '
            "merge it with <code>bash scripts/merge.sh RUN_DIR OUT --best</code>.</p>"
        )
    elif problem:
        out.append(f'<p id="best-checkpoint" class="sev-warning">{esc(problem)}</p>')
    return out


def render_html(
    title: str,
    data: rp.RunData,
    canon: rp.Canonical,
    findings: list[rf.Finding],
    summary: dict[str, Any],
    refresh_s: int | None = None,
    evals: EvalFile | None = None,
) -> str:
    """The whole report as one HTML document (no external resources)."""
    steps = canon.all_steps
    x_range = (float(min(steps)), float(max(steps))) if steps else (0.0, 1.0)
    head = _head(title, data, summary, refresh_s)
    body = _cards(summary, bool(steps))
    body += _guard_section(summary, findings)
    body += _pages_section(summary.get("pages") or {})
    body += _health_section(findings, data.issues)
    body += _curves_section(canon, findings, x_range)
    if evals is not None and evals.rows:
        body += _evals_section(evals, canon, summary["checkpoint_evals"], x_range)
    body += _time_section(summary)
    body += _reference_tables(summary)
    return "\n".join(part for part in head + body if part)


def _head(
    title: str, data: rp.RunData, summary: dict[str, Any], refresh_s: int | None
) -> list[str]:
    """The document's head (a refresh for --follow) and the page's title and sources."""
    esc = html.escape
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else "",
        f"<title>{esc(title)} - PPO run report</title><style>{CSS}</style></head><body>",
        f"<h1>PPO run report: {esc(title)}</h1>",
        f'<div class="meta">generated {esc(summary["generated_at"])} from '
        + ", ".join(f"<code>{esc(src)}</code>" for src in data.sources)
        + f" ({esc('/'.join(summary['formats']))})</div>",
    ]


def _cards(summary: dict[str, Any], has_steps: bool) -> list[str]:
    """The run in a few cards: accuracy, steps, wall-clock, throughput, memory, health."""
    esc = html.escape
    val = summary["validation"]
    best = val["best"]
    thr = summary["throughput"]
    counts = summary["health_counts"]
    cards = [
        (
            "best validation accuracy",
            f"{best['value']:.4g} @ step {best['step']}" if best else "n/a",
        ),
        ("final validation accuracy", final_val_text(val)),
        (
            "steps",
            f"{summary['steps']['count']} ({summary['steps']['first']}-{summary['steps']['last']})"
            if has_steps
            else "0",
        ),
        ("logged wall-clock", duration(summary["time"]["wall_clock_s"])),
        (
            "tokens/s" + (" (estimated)" if thr["estimated"] else ""),
            f"{thr['tokens_per_s']:.0f}" if thr["tokens_per_s"] else "n/a",
        ),
        ("peak GPU memory", memory_text(summary["memory"])),
        (
            "health",
            f"{counts['error']} errors, {counts['warning']} warnings, {counts['note']} notes",
        ),
    ]
    if summary.get("best_checkpoint"):
        cards.append(("kept best checkpoint", f"step {summary['best_checkpoint']['step']}"))
    body = ['<div class="cards">']
    body += [f'<div class="card">{esc(k)}<b>{esc(v)}</b></div>' for k, v in cards]
    body.append("</div>")
    return body


def _pages_section(pages: dict[str, Any]) -> list[str]:
    """Links to the pages beside the report (replay, rollouts, questions), and why one is not."""
    esc = html.escape
    if not any(pages.get(key) for key in ("replay", "rollouts", "questions", "issues")):
        return []
    links = [
        f'<a id="{key}-link" href="{esc(pages[key])}">{text}</a>'
        for key, text in (("replay", "one iteration, replayed token by token"),
                          ("rollouts", "every rollout and validation answer"),
                          ("questions", "which questions changed across validation steps"))
        if pages.get(key)
    ]  # fmt: skip
    body = ["<h2>Look inside</h2><p>" + (" &middot; ".join(links) or "no page") + "</p>"]
    body += [f'<p class="meta">{esc(issue)}</p>' for issue in pages.get("issues", [])]
    return body


def _health_section(findings: list[rf.Finding], issues: list[rp.ParseIssue]) -> list[str]:
    """Every finding in a table (or none fired), and the input problems the reading met."""
    esc = html.escape
    body = ["<h2>Health checks</h2>"]
    if not findings:
        body.append('<p class="ok">No check fired.</p>')
    else:
        body.append(
            '<table id="health"><tr><th>severity</th><th>check</th><th>metric</th>'
            "<th>steps</th><th>what triggered it</th></tr>"
        )
        for f in findings:
            body.append(
                f'<tr class="finding"><td class="sev-{f.severity}">{f.severity}</td>'
                f"<td>{esc(f.check)}</td><td>{esc(f.metric)}</td>"
                f"<td>{f.start_step}-{f.end_step}</td><td>{esc(f.message)}</td></tr>"
            )
        body.append("</table>")
    body.append(
        '<p class="meta">What each check means and what to change: '
        "<code>docs/reading-a-ppo-run.md</code>. Thresholds are listed at the end.</p>"
    )
    if issues:
        body.append("<h2>Input problems (the rest was used)</h2><ul>")
        body += [f"<li><code>{esc(str(issue))}</code></li>" for issue in issues]
        body.append("</ul>")
    return body


def _curves_section(
    canon: rp.Canonical, findings: list[rf.Finding], x_range: tuple[float, float]
) -> list[str]:
    """Every line chart (findings shaded on them), then the step time by phase."""
    body = ['<h2>Curves</h2><div class="grid">']
    for plot in build_plots(canon, findings):
        body.append(render_line_plot(plot, x_range))
    other = rs.time_breakdown(canon)["other_by_step"]
    body.append(render_phase_plot(canon, x_range, other))
    body.append("</div>")
    return body


def _time_section(summary: dict[str, Any]) -> list[str]:
    """The share of wall-clock per phase, as a bar and a table, and how step time was read."""
    esc = html.escape
    thr = summary["throughput"]
    body = ["<h2>Where the time goes</h2>"]
    phases = summary["time"]["phases"]
    if not phases:
        return body + ["<p>No timing metrics logged.</p>"]
    body.append(render_share_bar(phases))
    body.append("<table><tr><th>phase</th><th>total</th><th>share</th><th>timed</th></tr>")
    for name, info in phases.items():
        where = "inside the step timer" if info["inside_step"] else "outside (validation)"
        body.append(
            f"<tr><td>{esc(name)}</td><td>{duration(info['total_s'])}</td>"
            f"<td>{info['share'] * 100:.1f}%</td><td>{where}</td></tr>"
        )
    body.append("</table>")
    derived = (
        "Step time = sum of the phases (this log has no step timer)."
        if summary["time"]["step_time_derived"]
        else "Step time as logged (timing_s/step); 'other' is the part no phase covers."
    )
    body.append(f'<p class="meta">{esc(derived)} Throughput: {esc(thr["basis"])}.</p>')
    return body


def _reference_tables(summary: dict[str, Any]) -> list[str]:
    """The metric names read (canonical name, meaning, verl key, a few values), the thresholds."""
    esc = html.escape
    body = ["<h2>Metric names</h2><table><tr><th>canonical</th><th>meaning</th>"]
    body.append("<th>read from</th>")
    body.append("<th>points</th><th>first</th><th>median</th><th>last</th></tr>")
    for name, info in summary["metrics"].items():
        body.append(
            f"<tr><td>{esc(name)}</td><td>{esc(info['label'])}</td>"
            f"<td><code>{esc(str(info['key']))}</code></td>"
            f"<td>{info['points']}</td><td>{num(info['first'])}</td>"
            f"<td>{num(info['median'])}</td><td>{num(info['last'])}</td></tr>"
        )
    body.append("</table>")

    body.append("<h2>Thresholds</h2><table><tr><th>name</th><th>value</th></tr>")
    for name, value in summary["thresholds"].items():
        body.append(f"<tr><td><code>{esc(name)}</code></td><td>{esc(str(value))}</td></tr>")
    body.append("</table></body></html>")
    return body
