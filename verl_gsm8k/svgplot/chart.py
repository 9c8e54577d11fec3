"""Line charts as inline SVG, standard library only: a page that embeds them needs nothing else
to open.

``Plot`` (a chart: title, ``Line`` series, y label, log or linear y, shaded bands, marked points)
-> ``render_line_plot(plot, x_range)``; ``downsample`` keeps at most ``MAX_DRAWN`` points a series
(each run's low and high, so a spike is still drawn). The parts, for other kinds of chart:
``Axes`` (data -> pixels), ``axes_svg`` (frame, ticks, labels), ``legend_svg``, ``figure`` (the
``<svg>`` with the id, title and data attributes tests/browser.py reads), ``bucket_means``.
Which charts a page draws is its own choice: verl_gsm8k/runpage/plots.py (one run's report),
verl_gsm8k/compare/charts.py (the run comparison).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Ten: the algorithm benchmark compares nine runs on one page (bench/algorithms.py), each its own
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2",
           "#7f7f7f", "#bcbd22")  # fmt: skip
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


class Axes:
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


def fmt_x(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def axes_svg(axes: Axes, y_label: str, x_label: str = "step") -> list[str]:
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


def legend_svg(names: Sequence[tuple[str, str]]) -> tuple[str, int]:
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


def figure(
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
    legend_part, rows = legend_svg(legend)
    shift = (rows - 1) * LEGEND_ROW
    total = height + shift
    return (
        f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg class="plot" id="plot-{plot_id}" data-points="{points}" data-y-scale="{y_scale}" '
        f'viewBox="0 0 {W} {total}" width="{W}" height="{total}" role="img" '
        f'aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{html.escape(title)}</title>{legend_part}"
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


def bucket_means(
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
    axes = Axes(x_range, (min(values), max(values)), bool(log_y))
    count = max(len(line.points) for line in drawn)
    parts = axes_svg(axes, plot.y_label, plot.x_label)
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
                f"<title>{html.escape(plot.x_label)} {fmt_x(s)}: {v:.4g}</title></circle>"
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
    return figure(
        plot.plot_id,
        plot.title,
        count,
        parts,
        legend or [(drawn[0].name, drawn[0].colour)],
        y_scale="log" if log_y else "linear",
    )
