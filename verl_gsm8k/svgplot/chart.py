"""Line charts as inline SVG; tick-x / tick-y classes and data-y-scale map pixels back to values."""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf",
           "#e377c2", "#7f7f7f", "#bcbd22")  # fmt: skip
SEVERITY_COLOURS = {"error": "#d62728", "warning": "#ff7f0e", "note": "#1f77b4"}
MAX_DRAWN = 1200  # a low and a high per 2-3 pixels of a 562-pixel plot
W, H = 640, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 26, 38
Points = Sequence[tuple[float, float]]  # (x, value): x a step, samples seen or a time


@dataclass
class Line:
    name: str
    points: Points
    colour: str
    width: float = 1.5
    dots: bool = False
    faint: bool = False
    dashed: bool = False


@dataclass
class Plot:
    plot_id: str
    title: str
    lines: list[Line]
    y_label: str = ""
    log_y: bool | None = None  # None: log when positive values span more than 100x
    note: str = ""
    bands: list[tuple[int, int, str]] = field(default_factory=list)  # steps, severity
    marks: list[tuple[int, float, str]] = field(default_factory=list)  # step, value, label
    x_label: str = "step"
    missing: str = "not logged in this run"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(count - 1, 1)
    size = 10 ** math.floor(math.log10(raw))
    step = next(m * size for m in (1, 2, 2.5, 5, 10) if m * size >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 12) for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def tick_labels(values: Sequence[float]) -> list[str]:
    """The fewest digits that write every tick exactly (scientific past 1e5 or below 1e-3)."""
    values = [v + 0.0 for v in values]  # no "-0"
    big = max(map(abs, values), default=0.0)
    form = "e" if big >= 1e5 or big < 1e-3 else "f"
    labels: list[str] = []
    for digits in range(13):
        labels = ["0" if v == 0 else f"{v:.{digits}{form}}" for v in values]
        if all(abs(float(t) - v) <= 1e-9 * abs(v) for t, v in zip(labels, values, strict=True)):
            break
    return labels


class Axes:
    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], log_y: bool):
        self.x0, self.x1 = x_range[0], max(x_range[1], x_range[0] + 1)
        self.log_y = log_y
        lo, hi = (math.log10(v) for v in y_range) if log_y else y_range
        pad = (hi - lo) * 0.05 if hi > lo else abs(lo) * 0.1 or 1.0
        self.y0, self.y1 = lo - pad, hi + pad

    def x(self, step: float) -> float:
        return LEFT + (step - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, value: float) -> float:
        v = math.log10(value) if self.log_y else value
        return TOP + (self.y1 - v) / (self.y1 - self.y0) * (H - TOP - BOTTOM)


def axes_svg(axes: Axes, y_label: str, x_label: str = "step") -> list[str]:
    if axes.log_y:  # decades within the finite floats (10**-324 is 0, 10**309 overflows), <= 12
        lo, hi = max(math.ceil(axes.y0), -307), min(math.floor(axes.y1), 307)
        ys = [10.0**e for e in range(lo, hi + 1, max(1, -(-(hi - lo + 1) // 12)))]
        labels = [f"{v:g}" for v in ys]
    else:
        ys = nice_ticks(axes.y0, axes.y1)
        labels = tick_labels(ys)
    mid = (TOP + H - BOTTOM) / 2
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
           'fill="#fff" stroke="#bbb"/>']  # fmt: skip
    for v, label in zip(ys, labels, strict=True):
        y = axes.y(v)
        out.append(f'<line class="tick-y" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#eee"/><text class="tick-y" x="{LEFT - 6}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{label}</text>')  # fmt: skip
    for v in nice_ticks(axes.x0, axes.x1, 8):
        x = axes.x(v)
        out.append(f'<line class="tick-x" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
                   f'stroke="#f2f2f2"/><text class="tick-x" x="{x:.1f}" y="{H - BOTTOM + 15}" '
                   f'text-anchor="middle">{v:g}</text>')  # fmt: skip
    return out + [f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">'
                  f'{escape(x_label)}</text><text x="14" y="{mid}" text-anchor="middle" '
                  f'transform="rotate(-90 14 {mid})">{escape(y_label)}</text>']  # fmt: skip


def figure(plot_id: str, title: str, points: int, body: Sequence[str],
           legend: Sequence[tuple[str, str]], height: int = H, y_scale: str = "linear"
           ) -> str:  # fmt: skip
    """The parts in an <svg>, a legend across the top (each row 14 pixels)."""
    items, x, row = [], float(LEFT), 0
    for name, colour in legend:
        width = 22 + 6.5 * len(name)
        if x + width > W - RIGHT and x > LEFT:
            x, row = float(LEFT), row + 1
        y = 8 + 14 * row
        items.append(f'<rect x="{x:.0f}" y="{y}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14:.0f}" y="{y + 9}">{escape(name)}</text>')  # fmt: skip
        x += width
    total, t = height + 14 * row, escape(title)
    return (f'<figure class="chart"><figcaption>{t}</figcaption><svg class="plot" '
            f'id="plot-{plot_id}" data-points="{points}" data-y-scale="{y_scale}" '
            f'viewBox="0 0 {W} {total}" width="{W}" height="{total}" role="img" '
            f'aria-label="{t}" xmlns="http://www.w3.org/2000/svg"><title>{t}</title>'
            f'{"".join(items)}<g transform="translate(0,{14 * row})">{"".join(body)}</g></svg>'
            "</figure>")  # fmt: skip


def downsample(points: Points) -> list[tuple[float, float]]:
    n, runs = len(points), MAX_DRAWN // 2
    if n <= MAX_DRAWN:
        return list(points)
    out = []
    for r in range(runs):
        chunk = points[r * n // runs : (r + 1) * n // runs]
        ends = {min(range(len(chunk)), key=lambda k: chunk[k][1]),
                max(range(len(chunk)), key=lambda k: chunk[k][1])}  # fmt: skip
        out += [chunk[k] for k in sorted(ends)]
    return out


def bucket_means(steps: list[int], layers: list[list[float]], limit: int = MAX_DRAWN):
    """Steps and layers averaged over at most ``limit`` equal runs."""
    n = len(steps)
    if n <= limit:
        return steps, layers
    bounds = [(r * n // limit, (r + 1) * n // limit) for r in range(limit)]
    mids = [steps[(a + b - 1) // 2] for a, b in bounds]
    return mids, [[sum(layer[a:b]) / (b - a) for a, b in bounds] for layer in layers]


def render_line_plot(plot: Plot, x_range: tuple[float, float]) -> str:
    drawn = [line for line in plot.lines if line.points]
    if not drawn:
        note = f": {escape(plot.note)}" if plot.note else ""
        return (f'<div class="plot missing" id="plot-{plot.plot_id}"><b>{escape(plot.title)}'
                f"</b><br>{escape(plot.missing)}{note}</div>")  # fmt: skip
    values = [v for line in drawn for _, v in line.points]
    log_y = plot.log_y
    if log_y is None:
        log_y = min(values) > 0 and max(values) / min(values) > 100
    values = [v for v in values if v > 0 or not log_y]
    axes = Axes(x_range, (min(values), max(values)), log_y)
    parts = axes_svg(axes, plot.y_label, plot.x_label)
    for start, end, severity in plot.bands:
        a, b = axes.x(max(start, axes.x0)), axes.x(min(end, axes.x1))
        parts.append(f'<rect class="band" x="{a:.1f}" y="{TOP}" width="{max(b - a, 2):.1f}" '
                     f'height="{H - TOP - BOTTOM}" fill="{SEVERITY_COLOURS[severity]}" '
                     f'opacity="0.15"><title>{severity}: steps {start}-{end}</title>'
                     "</rect>")  # fmt: skip
    for line in drawn:
        pts = downsample([(s, v) for s, v in line.points if v > 0 or not log_y])
        style = ' stroke-opacity="0.35"' * line.faint + ' stroke-dasharray="5 3"' * line.dashed
        xy = " ".join(f"{axes.x(s):.1f},{axes.y(v):.1f}" for s, v in pts)
        parts.append(f'<polyline class="series" data-series="{escape(line.name)}" '
                     f'data-count="{len(pts)}" fill="none" stroke="{line.colour}" '
                     f'stroke-width="{line.width}"{style} points="{xy}"/>')  # fmt: skip
        parts += [f'<circle cx="{axes.x(s):.1f}" cy="{axes.y(v):.1f}" r="2.5" '
                  f'fill="{line.colour}"><title>{escape(plot.x_label)} {s:g}: {v:.4g}</title>'
                  "</circle>" for s, v in pts if line.dots]  # fmt: skip
    for step, value, label in plot.marks:
        x, y = axes.x(step), axes.y(value)
        anchor = "end" if x > W - RIGHT - 80 else "start" if x < LEFT + 80 else "middle"
        parts.append(f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="none" '
                     f'stroke="#000"/><text x="{x:.1f}" y="{max(y - 10, TOP + 10):.1f}" '
                     f'text-anchor="{anchor}" paint-order="stroke" stroke="#fff" '
                     f'stroke-width="3">{escape(label)}</text>')  # fmt: skip
    legend = [(line.name, line.colour) for line in drawn if not line.faint]
    legend = legend or [(drawn[0].name, drawn[0].colour)]
    count = max(len(line.points) for line in drawn)
    return figure(plot.plot_id, plot.title, count, parts, legend, y_scale=("linear", "log")[log_y])
