#!/usr/bin/env python3
"""Turn verl PPO/GRPO training metrics into a self-contained HTML report and a summary.json.

    python scripts/report.py RUN_DIR_OR_FILE [--out DIR] [--follow [--interval S]]

INPUT is a run directory (``metrics/metrics-<UTC timestamp>.jsonl`` segments, one per launch),
one verl file-logger JSONL file, or a verl console log. Both the verl 0.9.1 metric names and the
older ones (``timing/...``, ``val/test_score/...``) are understood. Standard library only: the
plots are SVG drawn here, so the HTML needs nothing else to open.

Exit status: 0 when a report was written (health findings do not change it), 1 when nothing at
all could be read or the report could not be written, 2 when INPUT does not exist.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

try:
    import report_metrics as rm
    from atomic_io import write_atomic
except ImportError:  # imported as scripts.report from the repository root
    from scripts import report_metrics as rm  # type: ignore[no-redef]
    from scripts.atomic_io import write_atomic  # type: ignore[no-redef]

HTML_NAME = "report.html"
SUMMARY_NAME = "summary.json"

# --------------------------------------------------------------------------------------------
# SVG plots
# --------------------------------------------------------------------------------------------

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2")
PHASE_COLOURS = {
    "gen": "#1f77b4",
    "reward": "#aec7e8",
    "old_log_prob": "#9edae5",
    "ref": "#17becf",
    "values": "#98df8a",
    "adv": "#c7c7c7",
    "update_critic": "#2ca02c",
    "update_actor": "#d62728",
    "update_weights": "#ff9896",
    "save_checkpoint": "#8c564b",
    "other": "#7f7f7f",
    "testing": "#9467bd",
}
SEVERITY_COLOURS = {"error": "#d62728", "warning": "#ff7f0e", "note": "#1f77b4"}
W, H = 640, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 26, 38


@dataclass
class Line:
    """One plotted series."""

    name: str
    points: rm.Series
    colour: str
    width: float = 1.5
    dots: bool = False
    faint: bool = False


@dataclass
class Plot:
    """A line chart; ``lines`` may be empty (then a "not logged" placeholder is drawn)."""

    plot_id: str
    title: str
    lines: list[Line]
    y_label: str = ""
    log_y: bool | None = None  # None: decide from the data
    note: str = ""
    bands: list[tuple[int, int, str]] = field(default_factory=list)
    marks: list[tuple[int, float, str]] = field(default_factory=list)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt_tick(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.0e}"
    return f"{value:.6g}"


class _Axes:
    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], log_y: bool):
        self.x0, self.x1 = x_range
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        self.log_y = log_y
        lo, hi = y_range
        if log_y:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi <= lo:
            pad = abs(lo) * 0.1 or 1.0
            lo, hi = lo - pad, hi + pad
        else:
            pad = (hi - lo) * 0.05
            lo, hi = lo - pad, hi + pad
        self.y0, self.y1 = lo, hi

    def x(self, step: float) -> float:
        return LEFT + (step - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, value: float) -> float:
        v = math.log10(value) if self.log_y else value
        return TOP + (self.y1 - v) / (self.y1 - self.y0) * (H - TOP - BOTTOM)


def _axes_svg(axes: _Axes, y_label: str) -> list[str]:
    parts = [
        f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
        'fill="#fff" stroke="#bbb"/>'
    ]
    if axes.log_y:
        y_ticks = [10.0**e for e in range(math.ceil(axes.y0), math.floor(axes.y1) + 1)]
    else:
        y_ticks = nice_ticks(axes.y0, axes.y1)
    for value in y_ticks:
        y = axes.y(value)
        parts.append(
            f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(value)}</text>'
        )
    for value in nice_ticks(axes.x0, axes.x1, 8):
        x = axes.x(value)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" stroke="#f2f2f2"/>'
            f'<text x="{x:.1f}" y="{H - BOTTOM + 15}" text-anchor="middle">{value:g}</text>'
        )
    parts.append(
        f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">step</text>'
        f'<text x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{html.escape(y_label)}</text>'
    )
    return parts


LEGEND_ROW = 14  # pixels per legend row; long legends wrap and push the chart down


def _legend(names: Sequence[tuple[str, str]]) -> tuple[str, int]:
    """Legend entries across the top, wrapped to the chart width. Returns (svg, rows)."""
    items = []
    x, row = float(LEFT), 0
    for name, colour in names:
        width = 22 + 6.5 * len(name)
        if x + width > W - RIGHT and x > LEFT:
            x, row = float(LEFT), row + 1
        y = 8 + row * LEGEND_ROW
        items.append(
            f'<rect x="{x:.0f}" y="{y}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14:.0f}" y="{y + 9}">{html.escape(name)}</text>'
        )
        x += width
    return "".join(items), row + 1


def _svg(
    plot_id: str,
    title: str,
    points: int,
    body: Sequence[str],
    legend: Sequence[tuple[str, str]],
    height: int = H,
) -> str:
    """Wrap chart parts in an <svg> whose id, title and data-points the tests and readers use."""
    legend_svg, rows = _legend(legend)
    shift = (rows - 1) * LEGEND_ROW
    total = height + shift
    return (
        f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg class="plot" id="plot-{plot_id}" data-points="{points}" '
        f'viewBox="0 0 {W} {total}" width="{W}" height="{total}" role="img" '
        f'aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{html.escape(title)}</title>{legend_svg}"
        f'<g transform="translate(0,{shift})">' + "".join(body) + "</g></svg></figure>"
    )


def render_line_plot(plot: Plot, x_range: tuple[float, float]) -> str:
    """A chart as an inline <svg>, or a placeholder <div> when there is nothing to draw."""
    drawn = [line for line in plot.lines if line.points]
    if not drawn:
        return (
            f'<div class="plot missing" id="plot-{plot.plot_id}">'
            f"<b>{html.escape(plot.title)}</b><br>not logged in this run"
            f"{': ' + html.escape(plot.note) if plot.note else ''}</div>"
        )
    values = [v for line in drawn for _, v in line.points]
    log_y = plot.log_y
    if log_y is None:
        positive = min(values) > 0
        log_y = positive and max(values) / min(values) > 100
    if log_y:
        values = [v for v in values if v > 0]
    axes = _Axes(x_range, (min(values), max(values)), bool(log_y))
    count = max(len(line.points) for line in drawn)
    parts = _axes_svg(axes, plot.y_label)
    for start, end, severity in plot.bands:
        x_a, x_b = axes.x(max(start, axes.x0)), axes.x(min(end, axes.x1))
        parts.append(
            f'<rect class="band" x="{x_a:.1f}" y="{TOP}" width="{max(x_b - x_a, 2):.1f}" '
            f'height="{H - TOP - BOTTOM}" fill="{SEVERITY_COLOURS[severity]}" opacity="0.15">'
            f"<title>{severity}: steps {start}-{end}</title></rect>"
        )
    for line in drawn:
        pts = [(s, v) for s, v in line.points if v > 0 or not log_y]
        coords = " ".join(f"{axes.x(s):.1f},{axes.y(v):.1f}" for s, v in pts)
        opacity = ' stroke-opacity="0.35"' if line.faint else ""
        parts.append(
            f'<polyline class="series" data-series="{html.escape(line.name)}" '
            f'data-count="{len(pts)}" fill="none" stroke="{line.colour}" '
            f'stroke-width="{line.width}"{opacity} points="{coords}"/>'
        )
        if line.dots:
            parts.extend(
                f'<circle cx="{axes.x(s):.1f}" cy="{axes.y(v):.1f}" r="2.5" fill="{line.colour}">'
                f"<title>step {s}: {v:.4g}</title></circle>"
                for s, v in pts
            )
    for step, value, label in plot.marks:
        x, y = axes.x(step), axes.y(value)
        # keep the label inside the frame near either edge
        anchor = "end" if x > W - RIGHT - 80 else "start" if x < LEFT + 80 else "middle"
        parts.append(
            f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="none" stroke="#000"/>'
            f'<text x="{x:.1f}" y="{max(y - 10, TOP + 10):.1f}" text-anchor="{anchor}" '
            'paint-order="stroke" stroke="#fff" stroke-width="3">'
            f"{html.escape(label)}</text>"
        )
    legend = [(line.name, line.colour) for line in drawn if not line.faint]
    return _svg(
        plot.plot_id, plot.title, count, parts, legend or [(drawn[0].name, drawn[0].colour)]
    )


def render_phase_plot(canon: rm.Canonical, x_range: tuple[float, float], other: rm.Series) -> str:
    """Stacked areas: seconds per step spent in each phase inside the step timer."""
    layers: list[tuple[str, dict[int, float]]] = [
        (name, dict(points))
        for name, points in sorted(
            canon.phases.items(),
            key=lambda kv: rm.PHASE_ORDER.index(kv[0]) if kv[0] in rm.PHASE_ORDER else 99,
        )
        if name not in rm.OUTSIDE_STEP_PHASES
    ]
    if any(v > 0 for _, v in other):
        layers.append(("other", dict(other)))
    steps = sorted({s for _, layer in layers for s in layer})
    title = "Step time by phase (stacked, s)"
    if not steps:
        return (
            '<div class="plot missing" id="plot-step_time"><b>' + title + "</b><br>"
            "not logged in this run</div>"
        )
    totals = [sum(layer.get(s, 0.0) for _, layer in layers) for s in steps]
    axes = _Axes(x_range, (0.0, max(totals) or 1.0), False)
    parts = _axes_svg(axes, "seconds")
    base = [0.0] * len(steps)
    for name, layer in layers:
        top = [b + layer.get(s, 0.0) for b, s in zip(base, steps, strict=True)]
        upper = " ".join(
            f"{axes.x(s):.1f},{axes.y(v):.1f}" for s, v in zip(steps, top, strict=True)
        )
        lower = " ".join(
            f"{axes.x(s):.1f},{axes.y(v):.1f}"
            for s, v in reversed(list(zip(steps, base, strict=True)))
        )
        colour = PHASE_COLOURS.get(name, "#bcbd22")
        parts.append(
            f'<polygon class="series" data-series="{html.escape(name)}" '
            f'data-count="{len(steps)}" fill="{colour}" fill-opacity="0.85" stroke="none" '
            f'points="{upper} {lower}"><title>{html.escape(name)}</title></polygon>'
        )
        base = top
    legend = [(name, PHASE_COLOURS.get(name, "#bcbd22")) for name, _ in layers]
    return _svg("step_time", title, len(steps), parts, legend)


def render_share_bar(phases: dict[str, dict[str, Any]]) -> str:
    """One horizontal bar: share of the logged wall-clock per phase (validation included)."""
    parts: list[str] = []
    x = float(LEFT)
    span = W - LEFT - RIGHT
    for name, info in phases.items():
        width = info["share"] * span
        colour = PHASE_COLOURS.get(name, "#bcbd22")
        parts.append(
            f'<rect class="series" data-series="{html.escape(name)}" data-count="1" x="{x:.1f}" '
            f'y="28" width="{width:.1f}" height="22" fill="{colour}">'
            f"<title>{html.escape(name)}: {info['share'] * 100:.1f}%</title></rect>"
        )
        if width > 34:
            parts.append(
                f'<text x="{x + width / 2:.1f}" y="43" text-anchor="middle" fill="#fff">'
                f"{info['share'] * 100:.0f}%</text>"
            )
        x += width
    legend = [(n, PHASE_COLOURS.get(n, "#bcbd22")) for n in phases]
    title = "Share of logged wall-clock per phase"
    return _svg("time_share", title, len(phases), parts, legend, height=60)


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

# Which plot a finding on a canonical metric is drawn on.
_PLOT_OF_METRIC = {
    "val_acc": "val_acc",
    "score": "score",
    "kl": "kl",
    "kl_loss": "kl",
    "entropy": "entropy",
    "response_length_mean": "response_length",
    "vf_loss": "vf_loss",
    "pg_clipfrac": "clipfrac",
}


def _smoothed(points: rm.Series, window: int) -> rm.Series:
    values = rm.rolling_median([v for _, v in points], window)
    return [(s, v) for (s, _), v in zip(points, values, strict=True)]


def _with_trend(name: str, points: rm.Series, colour: str, window: int) -> list[Line]:
    """Raw values faint plus a rolling median, for noisy per-step metrics."""
    if len(points) <= 3 * window:
        return [Line(name, points, colour)]
    return [
        Line(f"{name} (raw)", points, colour, width=1.0, faint=True),
        Line(name, _smoothed(points, window), colour, width=2.0),
    ]


def build_plots(canon: rm.Canonical, findings: list[rm.Finding]) -> list[Plot]:
    """The report's line charts, in display order."""
    s = canon.series
    win = rm.THRESHOLDS.window
    val = s.get("val_acc", [])
    marks: list[tuple[int, float, str]] = []
    if val:
        top = max(v for _, v in val)
        best_step = next(st for st, v in val if v == top)
        marks.append((best_step, top, f"best {top:.3f} @ {best_step}"))
    kl_lines: list[Line] = []
    for i, name in enumerate(("kl", "kl_loss")):
        if name in s:
            kl_lines += _with_trend(name, s[name], PALETTE[i], win)
    if not kl_lines and "ppo_kl" in s:
        kl_lines = _with_trend("ppo_kl (old->new policy)", s["ppo_kl"], PALETTE[2], win)
    plots = [
        Plot(
            "val_acc",
            f"Validation accuracy ({canon.val_key or 'not logged'})",
            [Line("val_acc", val, PALETTE[0], width=2.0, dots=True)],
            "accuracy",
            log_y=False,
            marks=marks,
        ),
        Plot(
            "score",
            "Train score (critic/score/mean) and reward incl. KL (critic/rewards/mean)",
            _with_trend("score", s.get("score", []), PALETTE[0], win)
            + _with_trend("reward", s.get("reward", []), PALETTE[2], win),
            "score",
            log_y=False,
        ),
        Plot(
            "kl",
            "KL to the reference policy",
            kl_lines,
            "KL",
            log_y=False,
            note="needs algorithm.use_kl_in_reward=True or actor.use_kl_loss=True",
        ),
        Plot(
            "entropy",
            "Policy entropy (per token)",
            _with_trend("entropy", s.get("entropy", []), PALETTE[3], win),
            "nats",
            log_y=False,
            note="with entropy_coeff=0 set actor.calculate_entropy=True",
        ),
        Plot(
            "response_length",
            "Response length: mean and max (tokens)",
            _with_trend("mean", s.get("response_length_mean", []), PALETTE[0], win)
            + [Line("max", s.get("response_length_max", []), PALETTE[1], width=1.0)],
            "tokens",
            log_y=False,
        ),
        Plot(
            "response_length_clip_ratio",
            "Response length clip ratio (share of responses cut at max length)",
            _with_trend("clip_ratio", s.get("response_length_clip_ratio", []), PALETTE[4], win),
            "share",
            log_y=False,
            note="response_length/clip_ratio is logged by newer verl only",
        ),
        Plot(
            "vf_loss",
            "Value (critic) loss",
            _with_trend("vf_loss", s.get("vf_loss", []), PALETTE[5], win),
            "loss",
            note="no critic (GRPO) or not logged",
        ),
        Plot(
            "clipfrac",
            "PPO clip fraction of the policy update (actor/pg_clipfrac)",
            _with_trend("pg_clipfrac", s.get("pg_clipfrac", []), PALETTE[0], win),
            "fraction",
            log_y=False,
        ),
        Plot(
            "grad_norm",
            "Gradient norms (before clipping)",
            _with_trend("actor", s.get("actor_grad_norm", []), PALETTE[1], win)
            + _with_trend("critic", s.get("critic_grad_norm", []), PALETTE[5], win),
            "norm",
        ),
        Plot(
            "throughput",
            "Throughput (tokens/s per GPU)"
            + (
                " - estimated from batch size, lengths and step time"
                if canon.throughput_estimated
                else ""
            ),
            _with_trend("tokens/s", s.get("throughput", []), PALETTE[2], win),
            "tokens/s",
            log_y=False,
        ),
    ]
    by_id = {plot.plot_id: plot for plot in plots}
    for finding in findings:
        targets = (
            list(by_id) if finding.check == "nan_inf" else [_PLOT_OF_METRIC.get(finding.metric, "")]
        )
        for target in targets:
            if target in by_id:
                by_id[target].bands.append((finding.start_step, finding.end_step, finding.severity))
    return plots


_CSS = """
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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render_html(
    title: str,
    data: rm.RunData,
    canon: rm.Canonical,
    findings: list[rm.Finding],
    summary: dict[str, Any],
    refresh_s: int | None = None,
) -> str:
    """The whole report as one HTML document (no external resources)."""
    esc = html.escape
    steps = canon.all_steps
    x_range = (float(min(steps)), float(max(steps))) if steps else (0.0, 1.0)
    breakdown = rm.time_breakdown(canon)
    val = summary["validation"]
    best = val["best"]
    final = val["final"]
    thr = summary["throughput"]
    counts = summary["health_counts"]
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else "",
        f"<title>{esc(title)} - PPO run report</title><style>{_CSS}</style></head><body>",
        f"<h1>PPO run report: {esc(title)}</h1>",
        f'<div class="meta">generated {esc(summary["generated_at"])} from '
        + ", ".join(f"<code>{esc(src)}</code>" for src in data.sources)
        + f" ({esc('/'.join(summary['formats']))})</div>",
    ]
    cards = [
        (
            "best validation accuracy",
            f"{best['value']:.4g} @ step {best['step']}" if best else "n/a",
        ),
        (
            "final validation accuracy",
            f"{final['value']:.4g} @ step {final['step']}" if final else "n/a",
        ),
        (
            "steps",
            f"{summary['steps']['count']} ({summary['steps']['first']}-{summary['steps']['last']})"
            if steps
            else "0",
        ),
        ("logged wall-clock", _duration(summary["time"]["wall_clock_s"])),
        (
            "tokens/s" + (" (estimated)" if thr["estimated"] else ""),
            f"{thr['tokens_per_s']:.0f}" if thr["tokens_per_s"] else "n/a",
        ),
        (
            "health",
            f"{counts['error']} errors, {counts['warning']} warnings, {counts['note']} notes",
        ),
    ]
    body = ['<div class="cards">']
    body += [f'<div class="card">{esc(k)}<b>{esc(v)}</b></div>' for k, v in cards]
    body.append("</div>")

    body.append("<h2>Health checks</h2>")
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
    if data.issues:
        body.append("<h2>Input problems (the rest was used)</h2><ul>")
        body += [f"<li><code>{esc(str(issue))}</code></li>" for issue in data.issues]
        body.append("</ul>")

    body.append('<h2>Curves</h2><div class="grid">')
    for plot in build_plots(canon, findings):
        body.append(render_line_plot(plot, x_range))
    body.append(render_phase_plot(canon, x_range, breakdown["other_by_step"]))
    body.append("</div>")

    body.append("<h2>Where the time goes</h2>")
    phases = summary["time"]["phases"]
    if phases:
        body.append(render_share_bar(phases))
        body.append("<table><tr><th>phase</th><th>total</th><th>share</th><th>timed</th></tr>")
        for name, info in phases.items():
            where = "inside the step timer" if info["inside_step"] else "outside (validation)"
            body.append(
                f"<tr><td>{esc(name)}</td><td>{_duration(info['total_s'])}</td>"
                f"<td>{info['share'] * 100:.1f}%</td><td>{where}</td></tr>"
            )
        body.append("</table>")
        derived = (
            "Step time = sum of the phases (this log has no step timer)."
            if summary["time"]["step_time_derived"]
            else "Step time as logged (timing_s/step); 'other' is the part no phase covers."
        )
        body.append(f'<p class="meta">{esc(derived)} Throughput: {esc(thr["basis"])}.</p>')
    else:
        body.append("<p>No timing metrics logged.</p>")

    body.append("<h2>Metric names</h2><table><tr><th>canonical</th><th>meaning</th>")
    body.append("<th>read from</th>")
    body.append("<th>points</th><th>first</th><th>median</th><th>last</th></tr>")
    for name, info in summary["metrics"].items():
        body.append(
            f"<tr><td>{esc(name)}</td><td>{esc(info['label'])}</td>"
            f"<td><code>{esc(str(info['key']))}</code></td>"
            f"<td>{info['points']}</td><td>{_num(info['first'])}</td>"
            f"<td>{_num(info['median'])}</td><td>{_num(info['last'])}</td></tr>"
        )
    body.append("</table>")

    body.append("<h2>Thresholds</h2><table><tr><th>name</th><th>value</th></tr>")
    for name, value in summary["thresholds"].items():
        body.append(f"<tr><td><code>{esc(name)}</code></td><td>{esc(str(value))}</td></tr>")
    body.append("</table></body></html>")
    return "\n".join(part for part in head + body if part)


# --------------------------------------------------------------------------------------------
# Terminal summary
# --------------------------------------------------------------------------------------------


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
    best, final = val["best"], val["final"]
    if best:
        also = f" (again at {', '.join(map(str, best['also_at']))})" if best["also_at"] else ""
        lines.append(f"  best val accuracy   : {best['value']:.4g} at step {best['step']}{also}")
        lines.append(f"  final val accuracy  : {final['value']:.4g} at step {final['step']}")
    else:
        lines.append("  validation accuracy : not logged")
    score = summary["train_score"]
    if score["final_median_10"] is not None:
        lines.append(
            f"  train score         : median of last 10 steps {score['final_median_10']:.4g}"
        )
    lines.append(
        f"  wall-clock (logged) : {_duration(tm['wall_clock_s'])} ({tm['wall_clock_s']:.0f} s: "
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
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def default_out_dir(input_path: Path) -> Path:
    """<run_dir>/report for a directory, <name>-report beside a file."""
    if input_path.is_dir():
        return input_path / "report"
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

    Raises rm.InputError (missing input), NothingReadError, or OSError (cannot write).
    """
    data, canon, findings, summary = rm.analyse(input_path)
    issues = [str(issue) for issue in data.issues]
    if not data.steps:
        detail = f" ({issues[0]})" if issues else ""
        raise NothingReadError(f"no metrics could be read from {input_path}{detail}")
    summary = {
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "input": str(input_path),
        **summary,
        "val_acc_by_step": canon.series.get("val_acc", []),
    }
    page = render_html(input_path.name, data, canon, findings, summary, refresh_s)
    payload = json.dumps(_json_safe(summary), indent=2, allow_nan=False) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / SUMMARY_NAME, payload)
    write_atomic(out_dir / HTML_NAME, page)
    return Result(summary, out_dir, issues)


def _json_safe(value: Any) -> Any:
    """Plain JSON: tuples become lists, non-finite floats (e.g. an overflowing sum) null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="report.py",
        description=(
            "Build a self-contained HTML report (plots, health checks, time breakdown) and a "
            "summary.json from verl PPO/GRPO training metrics, and print a short summary."
        ),
        epilog="Exit status: 0 report written; 1 nothing readable or cannot write; 2 no INPUT.",
    )
    parser.add_argument(
        "input",
        metavar="INPUT",
        type=Path,
        help=(
            "run directory (its metrics/*.jsonl segments are merged in name order, a later "
            "segment winning on overlapping steps), one verl file-logger .jsonl file, or a verl "
            "console log with 'step:N - key:value' lines"
        ),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "directory for report.html and summary.json (default: INPUT/report for a run "
            "directory, <name>-report next to a file); files are replaced atomically"
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
    print(f"report.py: error: {message}", file=sys.stderr)


def _run_once(args: argparse.Namespace, out_dir: Path, refresh_s: int | None) -> Result | int:
    try:
        return generate(args.input, out_dir, refresh_s)
    except rm.InputError as exc:
        _err(str(exc))
        return 2
    except NothingReadError as exc:
        _err(str(exc))
        return 1
    except OSError as exc:
        _err(f"cannot write the report to {out_dir}: {exc} (earlier report left as it was)")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        if isinstance(result, int):
            return result
        for issue in result.issues:
            print(f"report.py: warning: {issue}", file=sys.stderr)
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
            if isinstance(outcome, int):
                last_code = outcome
                print(f"[{stamp}] refresh {refreshes}: nothing written yet", flush=True)
            else:
                last, last_code = outcome, 0
                for issue in outcome.issues:
                    if issue not in shown_issues:
                        print(f"report.py: warning: {issue}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
