"""A page in headless Chromium (``dom``, ``render``), its charts read back in data coordinates
through their own ticks (``plot_series``). Without chromium a test skips; under CI=true fails."""

import math
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from helpers import capture, require_path

CHROMIUM = Path("/usr/bin/chromium")
# no sandbox (root in CI), nothing that reaches for the network
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")  # fmt: skip
WINDOW = (1400, 2400)
Point = tuple[float, float]


def require_chromium() -> Path:
    return require_path(CHROMIUM, f"{CHROMIUM} not installed (apt-get install "
                        "--no-install-recommends chromium; .ci/run installs it)")  # fmt: skip


def _chromium(args: list[str], tmp_dir: Path) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_dir)  # a new one each run
    return capture([require_chromium(), *FLAGS, f"--user-data-dir={profile}", *args], None, 120)


def dom(page: Path | str, tmp_dir: Path) -> str:
    url = page if isinstance(page, str) else page.resolve().as_uri()
    done = _chromium(["--dump-dom", url], tmp_dir)
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr
    return done.stdout


def render(html_path: Path, tmp_dir: Path) -> tuple[str, Path]:
    png = tmp_dir / f"{html_path.stem}.png"
    png.unlink(missing_ok=True)
    shot = _chromium([f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={png}",
                      html_path.resolve().as_uri()], tmp_dir)  # fmt: skip
    assert png.is_file(), f"chromium --screenshot failed ({shot.returncode}): {shot.stderr}"
    return dom(html_path, tmp_dir), png


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


class _Charts(HTMLParser):
    """Every chart of a page (title, ticks, series pixels), and by <svg> id its series."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: list[dict] = []
        self.svgs: dict[str, dict] = {}
        self.plot: dict | None = None
        self.caption: list[str] | None = None  # an open <figcaption>, or a placeholder's <b>
        self.placeholder = self.svg = False
        self.tick: str | None = None  # the axis of an open tick label

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "figcaption" or (tag == "b" and self.placeholder):
            self.caption = []
        self.placeholder |= tag == "div" and "missing" in classes
        if tag == "svg" and a.get("id", "").startswith("plot-"):
            self.plot = {"data-points": a.get("data-points"), "series": [], "names": []}
            self.svgs[a["id"][5:]] = self.plot
        elif self.plot is not None and a.get("data-series"):
            self.plot["names"].append((a["data-series"], tag))
            if tag in ("polyline", "polygon"):  # a stacked area: its top edge, then its bottom
                points = sum("," in xy for xy in a.get("points", "").split())
                self.plot["series"].append(
                    (int(a["data-count"]), points // (1 + (tag == "polygon"))))  # fmt: skip
        if tag == "svg" and "plot" in classes and self.charts and not self.charts[-1]["drawn"]:
            self.svg = True
            self.charts[-1].update(drawn=True, log=a.get("data-y-scale") == "log")
        elif self.svg:
            axis = next((c[-1] for c in classes if c in ("tick-x", "tick-y")), None)
            chart = self.charts[-1]
            if axis and tag == "line":
                chart[axis][0].append(float(a["x1" if axis == "x" else "y1"]))
            elif axis and tag == "text":
                self.tick = axis
                chart[axis][1].append("")
            elif tag == "polyline" and "series" in classes:
                pairs = (p.split(",") for p in a.get("points", "").split())
                chart["series"][a.get("data-series", "")] = [(float(x), float(y)) for x, y in pairs]

    def handle_data(self, data: str) -> None:
        if self.caption is not None:
            self.caption.append(data)
        elif self.svg and self.tick:
            self.charts[-1][self.tick][1][-1] += data

    def handle_endtag(self, tag: str) -> None:
        if self.caption is not None and tag in ("figcaption", "b"):
            title = " ".join("".join(self.caption).split())
            self.charts.append({"title": title, "drawn": False, "log": False, "x": ([], []),
                                "y": ([], []), "series": {}})  # fmt: skip
            self.caption = None
        self.placeholder &= tag != "div"
        self.svg &= tag != "svg"
        self.plot = None if tag == "svg" else self.plot
        self.tick = None if tag == "text" else self.tick


def _axis(pixels: list[float], labels: list[str], log: bool) -> tuple[float, float]:
    assert len(pixels) == len(labels) >= 2, f"an axis needs 2 labelled ticks: {pixels} {labels}"
    values = [math.log10(float(v)) if log else float(v) for v in labels]
    mp, mv = sum(pixels) / len(pixels), sum(values) / len(values)
    b = sum((p - mp) * (v - mv) for p, v in zip(pixels, values, strict=True)) / sum(
        (p - mp) ** 2 for p in pixels)  # fmt: skip
    return mv - b * mp, b


def chart_titles(page: str) -> list[str]:
    reader = _Charts()
    reader.feed(page)
    return [chart["title"] for chart in reader.charts]


def plot_series(page: str, title: str) -> dict[str, list[Point]]:
    """{series: [(x, y)]} of the one chart titled (or starting with) ``title``; {} for a
    chart not drawn; KeyError when no chart has that title."""
    reader = _Charts()
    reader.feed(page)
    found = [c for c in reader.charts if c["title"] == title] or [
        c for c in reader.charts if c["title"].startswith(title)]  # fmt: skip
    if len(found) != 1:
        raise KeyError(f"{len(found)} charts titled {title!r}: {chart_titles(page)}")
    chart = found[0]
    if not chart["drawn"]:
        return {}
    (ax, bx), (ay, by) = _axis(*chart["x"], False), _axis(*chart["y"], chart["log"])
    scale = (lambda v: 10**v) if chart["log"] else (lambda v: v)
    return {name: [(ax + bx * px, scale(ay + by * py)) for px, py in pixels]
            for name, pixels in chart["series"].items()}  # fmt: skip


def parse_svgs(page: str) -> dict[str, dict]:
    """By chart id: {"data-points", "names": [(series, tag)], "series": [(count, drawn)]}."""
    reader = _Charts()
    reader.feed(page)
    return reader.svgs
