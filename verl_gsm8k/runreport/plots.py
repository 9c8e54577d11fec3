"""The report's charts as inline SVG: line plots with findings shaded, and the time per phase.

Standard library only, so the HTML page needs nothing else to open.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_gsm8k.analysis import finding as rf
from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.analysis import vocab as rv
from verl_gsm8k.analysis.thresholds import THRESHOLDS

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
# Most points one series draws. A chart is 562 pixels wide, so 1200 points (a low and a high
# per 2-3 pixels) look the same as 60,000 while keeping the page small however long the run.
MAX_DRAWN = 1200
W, H = 640, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 26, 38


# (x, value) pairs: x is the step, or in a run comparison also samples seen or wall time.
Points = Sequence[tuple[float, float]]


@dataclass
class Line:
    """One plotted series."""

    name: str
    points: Points
    colour: str
    width: float = 1.5
    dots: bool = False
    faint: bool = False
    dashed: bool = False


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
    x_label: str = "step"
    missing: str = "not logged in this run"  # the placeholder's words when no line has points


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


def tick_labels(values: Sequence[float]) -> list[str]:
    """Labels of a linear axis' ticks, with the fewest digits that write every tick exactly (so
    0.99999925, 0.9999995, 0.99999975 do not all read "1", and a reader maps pixels back to
    values through them): fixed notation, or scientific beyond 1e5 or below 1e-3."""
    values = [v + 0.0 for v in values]  # no "-0"
    big = max((abs(v) for v in values), default=0.0)
    scientific = big >= 1e5 or big < 1e-3
    labels: list[str] = []
    for digits in range(13):
        labels = [
            "0" if v == 0 else f"{v:.{digits}e}" if scientific else f"{v:.{digits}f}"
            for v in values
        ]
        exact = zip(labels, values, strict=True)
        if all(abs(float(label) - v) <= 1e-9 * abs(v) for label, v in exact):
            break
    return labels


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


def _fmt_x(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _axes_svg(axes: _Axes, y_label: str, x_label: str = "step") -> list[str]:
    parts = [
        f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
        'fill="#fff" stroke="#bbb"/>'
    ]
    if axes.log_y:  # decades: 1e-05, 0.0001, 0.001 ... are told apart by :g
        y_ticks = [10.0**e for e in range(math.ceil(axes.y0), math.floor(axes.y1) + 1)]
        labels = [f"{value:g}" for value in y_ticks]
    else:
        y_ticks = nice_ticks(axes.y0, axes.y1)
        labels = tick_labels(y_ticks)
    for value, label in zip(y_ticks, labels, strict=True):
        y = axes.y(value)
        parts.append(
            f'<line class="tick-y" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#eee"/>'
            f'<text class="tick-y" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{label}</text>"
        )
    for value in nice_ticks(axes.x0, axes.x1, 8):
        x = axes.x(value)
        parts.append(
            f'<line class="tick-x" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
            'stroke="#f2f2f2"/>'
            f'<text class="tick-x" x="{x:.1f}" y="{H - BOTTOM + 15}" text-anchor="middle">'
            f"{value:g}</text>"
        )
    parts.append(
        f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">'
        f"{html.escape(x_label)}</text>"
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
    y_scale: str = "linear",
) -> str:
    """Wrap chart parts in an <svg> whose id, title and data-points the tests and readers use.

    Tick lines and labels carry class tick-x / tick-y and the <svg> its data-y-scale (linear or
    log), so that a reader can map a series' pixels back to steps and values (tests/browser.py).
    """
    legend_svg, rows = _legend(legend)
    shift = (rows - 1) * LEGEND_ROW
    total = height + shift
    return (
        f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg class="plot" id="plot-{plot_id}" data-points="{points}" data-y-scale="{y_scale}" '
        f'viewBox="0 0 {W} {total}" width="{W}" height="{total}" role="img" '
        f'aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{html.escape(title)}</title>{legend_svg}"
        f'<g transform="translate(0,{shift})">' + "".join(body) + "</g></svg></figure>"
    )


def downsample(points: Points, limit: int = MAX_DRAWN) -> list[tuple[float, float]]:
    """At most ``limit`` points: the lowest and the highest of each of limit // 2 equal runs of
    consecutive points, in step order, so that a one-step spike is still drawn."""
    n = len(points)
    if n <= limit:
        return list(points)
    runs = limit // 2
    out: list[tuple[float, float]] = []
    for r in range(runs):
        chunk = points[r * n // runs : (r + 1) * n // runs]
        low = min(range(len(chunk)), key=lambda k: chunk[k][1])
        high = max(range(len(chunk)), key=lambda k: chunk[k][1])
        out.extend(chunk[k] for k in sorted({low, high}))
    return out


def _bucket_means(
    steps: list[int], layers: list[list[float]], limit: int = MAX_DRAWN
) -> tuple[list[int], list[list[float]]]:
    """Steps and per-layer values averaged over at most ``limit`` equal runs of steps (each run
    drawn at its middle step), so a stacked area keeps its total time per run."""
    n = len(steps)
    if n <= limit:
        return steps, layers
    bounds = [(r * n // limit, (r + 1) * n // limit) for r in range(limit)]
    mids = [steps[(a + b - 1) // 2] for a, b in bounds]
    return mids, [[sum(layer[a:b]) / (b - a) for a, b in bounds] for layer in layers]


def render_line_plot(plot: Plot, x_range: tuple[float, float]) -> str:
    """A chart as an inline <svg>, or a placeholder <div> when there is nothing to draw."""
    drawn = [line for line in plot.lines if line.points]
    if not drawn:
        return (
            f'<div class="plot missing" id="plot-{plot.plot_id}">'
            f"<b>{html.escape(plot.title)}</b><br>{html.escape(plot.missing)}"
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
    parts = _axes_svg(axes, plot.y_label, plot.x_label)
    for start, end, severity in plot.bands:
        x_a, x_b = axes.x(max(start, axes.x0)), axes.x(min(end, axes.x1))
        parts.append(
            f'<rect class="band" x="{x_a:.1f}" y="{TOP}" width="{max(x_b - x_a, 2):.1f}" '
            f'height="{H - TOP - BOTTOM}" fill="{SEVERITY_COLOURS[severity]}" opacity="0.15">'
            f"<title>{severity}: steps {start}-{end}</title></rect>"
        )
    for line in drawn:
        pts = downsample([(s, v) for s, v in line.points if v > 0 or not log_y])
        coords = " ".join(f"{axes.x(s):.1f},{axes.y(v):.1f}" for s, v in pts)
        opacity = ' stroke-opacity="0.35"' if line.faint else ""
        opacity += ' stroke-dasharray="5 3"' if line.dashed else ""
        parts.append(
            f'<polyline class="series" data-series="{html.escape(line.name)}" '
            f'data-count="{len(pts)}" fill="none" stroke="{line.colour}" '
            f'stroke-width="{line.width}"{opacity} points="{coords}"/>'
        )
        if line.dots:
            parts.extend(
                f'<circle cx="{axes.x(s):.1f}" cy="{axes.y(v):.1f}" r="2.5" fill="{line.colour}">'
                f"<title>{html.escape(plot.x_label)} {_fmt_x(s)}: {v:.4g}</title></circle>"
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
        plot.plot_id,
        plot.title,
        count,
        parts,
        legend or [(drawn[0].name, drawn[0].colour)],
        y_scale="log" if log_y else "linear",
    )


def render_phase_plot(canon: rp.Canonical, x_range: tuple[float, float], other: rp.Series) -> str:
    """Stacked areas: seconds per step spent in each phase inside the step timer."""
    layers: list[tuple[str, dict[int, float]]] = [
        (name, dict(points))
        for name, points in sorted(
            canon.phases.items(),
            key=lambda kv: rv.PHASE_ORDER.index(kv[0]) if kv[0] in rv.PHASE_ORDER else 99,
        )
        if name not in rv.OUTSIDE_STEP_PHASES
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
    xs, heights = _bucket_means(steps, [[layer.get(s, 0.0) for s in steps] for _, layer in layers])
    totals = [sum(column) for column in zip(*heights, strict=True)]
    axes = _Axes(x_range, (0.0, max(totals) or 1.0), False)
    parts = _axes_svg(axes, "seconds")
    base = [0.0] * len(xs)
    for (name, _), height in zip(layers, heights, strict=True):
        top = [b + h for b, h in zip(base, height, strict=True)]
        upper = " ".join(f"{axes.x(s):.1f},{axes.y(v):.1f}" for s, v in zip(xs, top, strict=True))
        lower = " ".join(
            f"{axes.x(s):.1f},{axes.y(v):.1f}"
            for s, v in reversed(list(zip(xs, base, strict=True)))
        )
        colour = PHASE_COLOURS.get(name, "#bcbd22")
        parts.append(
            f'<polygon class="series" data-series="{html.escape(name)}" '
            f'data-count="{len(xs)}" fill="{colour}" fill-opacity="0.85" stroke="none" '
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
# Which plots the report draws
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
    "rollout_probs_diff_mean": "rollout_mismatch",
}


def _smoothed(points: Points, window: int) -> list[tuple[float, float]]:
    values = rf.rolling_median([v for _, v in points], window)
    return [(s, v) for (s, _), v in zip(points, values, strict=True)]


def with_trend(name: str, points: Points, colour: str, window: int) -> list[Line]:
    """Raw values faint plus a rolling median, for noisy per-step metrics."""
    if len(points) <= 3 * window:
        return [Line(name, points, colour)]
    return [
        Line(f"{name} (raw)", points, colour, width=1.0, faint=True),
        Line(name, _smoothed(points, window), colour, width=2.0),
    ]


def build_plots(canon: rp.Canonical, findings: list[rf.Finding]) -> list[Plot]:
    """The report's line charts, in display order."""
    s = canon.series
    win = THRESHOLDS.window
    val = s.get("val_acc", [])
    marks: list[tuple[int, float, str]] = []
    if val:
        top = max(v for _, v in val)
        best_step = next(st for st, v in val if v == top)
        marks.append((best_step, top, f"best {top:.3f} @ {best_step}"))
    kl_lines: list[Line] = []
    for i, name in enumerate(("kl", "kl_loss")):
        if name in s:
            kl_lines += with_trend(name, s[name], PALETTE[i], win)
    if not kl_lines and "ppo_kl" in s:
        kl_lines = with_trend("ppo_kl (old->new policy)", s["ppo_kl"], PALETTE[2], win)
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
            with_trend("score", s.get("score", []), PALETTE[0], win)
            + with_trend("reward", s.get("reward", []), PALETTE[2], win),
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
            with_trend("entropy", s.get("entropy", []), PALETTE[3], win),
            "nats",
            log_y=False,
            note="actor/entropy: both verl 0.9.1 trainers (v1 and legacy) log it every step",
        ),
        Plot(
            "response_length",
            "Response length: mean and max (tokens)",
            with_trend("mean", s.get("response_length_mean", []), PALETTE[0], win)
            + [Line("max", s.get("response_length_max", []), PALETTE[1], width=1.0)],
            "tokens",
            log_y=False,
        ),
        Plot(
            rv.CUT_SHARE,
            "Responses cut at data.max_response_length (share)",
            with_trend("cut", s.get(rv.CUT_SHARE, []), PALETTE[4], win),
            "share",
            log_y=False,
            note="needs verl 0.9.1's response_length/clip_ratio and /max, and "
            "data.max_response_length (a run directory's launch record or a console log's "
            "config dump); verl's clip_ratio alone is the share as long as the step's longest "
            "response, not the share cut",
        ),
        Plot(
            "vf_loss",
            "Value (critic) loss",
            with_trend("vf_loss", s.get("vf_loss", []), PALETTE[5], win),
            "loss",
            note="no critic (GRPO) or not logged",
        ),
        Plot(
            "clipfrac",
            "PPO clip fraction of the policy update (actor/pg_clipfrac)",
            with_trend("pg_clipfrac", s.get("pg_clipfrac", []), PALETTE[0], win),
            "fraction",
            log_y=False,
        ),
        Plot(
            "grad_norm",
            "Gradient norms (before clipping)",
            with_trend("actor", s.get("actor_grad_norm", []), PALETTE[1], win)
            + with_trend("critic", s.get("critic_grad_norm", []), PALETTE[5], win),
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
            with_trend("tokens/s", s.get("throughput", []), PALETTE[2], win),
            "tokens/s",
            log_y=False,
        ),
        Plot(
            "rollout_mismatch",
            "Rollout vs training: |p_rollout - p_training| per token (training/rollout_probs_diff)",
            with_trend("max", s.get("rollout_probs_diff_max", []), PALETTE[1], win)
            + with_trend("mean", s.get("rollout_probs_diff_mean", []), PALETTE[0], win),
            "probability",
            note="needs actor_rollout_ref.rollout.calculate_log_probs=True (verl 0.9.1 default)",
        ),
        Plot(
            "rollout_corr",
            "Rollout vs training: Pearson correlation of token probabilities",
            with_trend("pearson", s.get("rollout_probs_corr", []), PALETTE[2], win),
            "correlation",
            log_y=False,
            note="needs actor_rollout_ref.rollout.calculate_log_probs=True (verl 0.9.1 default)",
        ),
        Plot(
            "memory",
            "Peak GPU memory per role (GiB, allocated; reserved faint)",
            [
                line
                for i, (role, (allocated, reserved)) in enumerate(rv.MEMORY_ROLES.items())
                for line in (
                    Line(role, s.get(allocated, []), PALETTE[i]),
                    Line(f"{role} reserved", s.get(reserved, []), PALETTE[i], faint=True),
                )
            ],
            "GiB",
            log_y=False,
            note="actor/perf/max_memory_allocated_gb and critic/perf/... (verl 0.9.1)",
        ),
        Plot(
            "val_aux",
            "Validation: the reward's other keys (val-aux, mean per validation)",
            [
                Line(name[len(rv.VAL_AUX_PREFIX) :], points, PALETTE[i % len(PALETTE)], dots=True)
                for i, (name, points) in enumerate(
                    (n, p)
                    for n, p in sorted(s.items())
                    if n.startswith(rv.VAL_AUX_PREFIX) and n != "val_acc"
                )
            ],
            "mean",
            log_y=False,
            note="val-aux/<data_source>/<key>/mean@N, logged by verl 0.9.1 for a reward dict",
        ),
    ]
    by_id = {plot.plot_id: plot for plot in plots}
    for finding in findings:
        if finding.check in ("nan_inf", "watchdog"):  # the whole run's state: every curve
            targets = list(by_id)
        elif finding.check == "rollout_mismatch":
            targets = ["rollout_mismatch", "rollout_corr"]
        elif finding.check == "kl_without_score_gain":
            targets = ["kl", "score"]
        else:
            targets = [_PLOT_OF_METRIC.get(finding.metric, "")]
        for target in targets:
            if target in by_id:
                by_id[target].bands.append((finding.start_step, finding.end_step, finding.severity))
    return plots
