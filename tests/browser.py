"""A report page in a real browser: headless Chromium renders it, and its plots are read back,
in data coordinates, from the DOM the browser built.

    chromium = require_chromium()             # skip without /usr/bin/chromium (fail under CI=true)
    dom, png = render(html_path, tmp_path)    # the DOM as Chromium serialises it, a screenshot
    series = plot_series(dom, "Validation accuracy")   # {"val_acc": [(step, value), ...]}

``plot_series`` maps each series' pixel coordinates back through the plot's own axis ticks (the
``tick-x`` / ``tick-y`` lines and their visible labels, and the <svg>'s ``data-y-scale``), so a
test sees what the page draws, where it draws it. .ci/run installs Debian's ``chromium``.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from helpers import require_path

CHROMIUM = Path("/usr/bin/chromium")
# Headless, no sandbox (root in CI), and nothing that reaches for the network: without the
# background-networking, component-update and sync switches a closed network refuses Chromium's
# connections over and over, and every run waits on them.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
WINDOW = (1400, 2400)

Point = tuple[float, float]


def require_chromium() -> Path:
    """/usr/bin/chromium; skip the test without it, or fail under CI=true (.ci/run installs it)."""
    return require_path(
        CHROMIUM,
        f"{CHROMIUM} not installed (apt-get install --no-install-recommends chromium; "
        ".ci/run installs it)",
    )


def _chromium(args: list[str], tmp_dir: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_dir)  # a new one every run
    return subprocess.run(
        [str(require_chromium()), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def render(
    html_path: Path, tmp_dir: Path, window: tuple[int, int] = WINDOW, timeout: float = 120
) -> tuple[str, Path]:
    """Open ``html_path`` in headless Chromium: (the DOM it built, a PNG screenshot of the page).

    Two runs, each with a new profile under ``tmp_dir``: ``--dump-dom`` and ``--screenshot``
    (``window`` wide and high). Raises AssertionError with Chromium's stderr if either fails.
    """
    uri = html_path.resolve().as_uri()
    dumped = _chromium(["--dump-dom", uri], tmp_dir, timeout)
    if dumped.returncode != 0 or "<html" not in dumped.stdout:
        raise AssertionError(f"chromium --dump-dom failed ({dumped.returncode}): {dumped.stderr}")
    png = tmp_dir / f"{html_path.stem}.png"
    png.unlink(missing_ok=True)
    shot = _chromium(
        [f"--window-size={window[0]},{window[1]}", f"--screenshot={png}", uri], tmp_dir, timeout
    )
    if not png.is_file():
        raise AssertionError(f"chromium --screenshot failed ({shot.returncode}): {shot.stderr}")
    return dumped.stdout, png


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its header; AssertionError if it is not a PNG."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise AssertionError(f"{path} is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


class _Chart:
    def __init__(self, title: str) -> None:
        self.title = title
        self.drawn = False  # an <svg>, not the "not logged" placeholder
        self.y_scale = "linear"
        self.ticks: dict[str, tuple[list[float], list[str]]] = {"x": ([], []), "y": ([], [])}
        self.series: dict[str, list[Point]] = {}


class _ChartReader(HTMLParser):
    """Every chart of a report page: its visible title, axis ticks and series pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: list[_Chart] = []
        self._caption: list[str] | None = None  # text of an open <figcaption> or placeholder <b>
        self._placeholder = False
        self._chart: _Chart | None = None  # the <svg> being read
        self._tick: str | None = None  # axis of an open tick label

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "figcaption" or (tag == "b" and self._placeholder):
            self._caption = []
        elif tag == "div" and "missing" in classes:
            self._placeholder = True
        elif tag == "svg" and "plot" in classes and self.charts and not self.charts[-1].drawn:
            self._chart = self.charts[-1]
            self._chart.drawn = True
            self._chart.y_scale = a.get("data-y-scale", "linear")
        elif self._chart is not None:
            axis = next((c[-1] for c in classes if c in ("tick-x", "tick-y")), None)
            if axis and tag == "line":
                pixel = float(a["x1"] if axis == "x" else a["y1"])
                self._chart.ticks[axis][0].append(pixel)
            elif axis and tag == "text":
                self._tick = axis
                self._chart.ticks[axis][1].append("")
            elif tag == "polyline" and "series" in classes:
                pixels: list[Point] = []
                for pair in a.get("points", "").split():
                    px, py = pair.split(",")
                    pixels.append((float(px), float(py)))
                self._chart.series[a.get("data-series", "")] = pixels

    def handle_data(self, data: str) -> None:
        if self._caption is not None:
            self._caption.append(data)
        elif self._chart is not None and self._tick is not None:
            labels = self._chart.ticks[self._tick][1]
            labels[-1] += data

    def handle_endtag(self, tag: str) -> None:
        if self._caption is not None and tag in ("figcaption", "b"):
            self.charts.append(_Chart(" ".join("".join(self._caption).split())))
            self._caption = None
        elif tag == "div" and self._placeholder:
            self._placeholder = False
        elif tag == "svg":
            self._chart = None
        elif tag == "text":
            self._tick = None


def _axis_map(pixels: list[float], labels: list[str], log: bool) -> tuple[float, float]:
    """(a, b) with value = a + b * pixel (of log10 value on a log axis), least squares."""
    if len(pixels) != len(labels) or len(pixels) < 2:
        raise AssertionError(f"an axis needs 2 or more labelled ticks: {pixels} {labels}")
    values = [math.log10(float(v)) if log else float(v) for v in labels]
    n = len(values)
    mp, mv = sum(pixels) / n, sum(values) / n
    spread = sum((p - mp) ** 2 for p in pixels)
    b = sum((p - mp) * (v - mv) for p, v in zip(pixels, values, strict=True)) / spread
    return mv - b * mp, b


def chart_titles(dom: str) -> list[str]:
    """The visible titles of every chart on the page, drawn or placeholder, in page order."""
    reader = _ChartReader()
    reader.feed(dom)
    return [chart.title for chart in reader.charts]


def plot_series(dom: str, title: str) -> dict[str, list[Point]]:
    """The data series of the line chart titled ``title``: {series name: [(x, y), ...]}.

    ``title`` is the chart's visible title, or the start of exactly one of them (for example
    "Validation accuracy" for "Validation accuracy (val-core/openai/gsm8k/acc/mean@1)"). Points
    come in drawing order (step order), in data coordinates read back through the chart's own
    axis ticks, so to the precision of the drawing (0.1 pixel, about 0.1% of the axis span).
    Long series are drawn downsampled (plots.MAX_DRAWN). A chart the run did not log (the "not
    logged" placeholder) gives {}; raises KeyError when no chart has that title.
    """
    reader = _ChartReader()
    reader.feed(dom)
    matches = [c for c in reader.charts if c.title == title] or [
        c for c in reader.charts if c.title.startswith(title)
    ]
    if len(matches) != 1:
        found = [c.title for c in reader.charts]
        raise KeyError(f"{len(matches)} charts titled {title!r}; the page has {found}")
    chart = matches[0]
    if not chart.drawn:
        return {}
    ax, bx = _axis_map(*chart.ticks["x"], log=False)
    log = chart.y_scale == "log"
    ay, by = _axis_map(*chart.ticks["y"], log=log)
    out: dict[str, list[Point]] = {}
    for name, pixels in chart.series.items():
        points = []
        for px, py in pixels:
            y = ay + by * py
            points.append((ax + bx * px, 10**y if log else y))
        out[name] = points
    return out
