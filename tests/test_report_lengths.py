"""The share of responses cut at the length limit; axis labels that tell close values apart."""

import re
from pathlib import Path
from typing import Any

import pytest
from report_runs import build_run, parse_svgs, write_jsonl

from verl_gsm8k.common import launch_record
from verl_gsm8k.report import cli as report
from verl_gsm8k.runpage import summary as rs
from verl_gsm8k.svgplot.chart import Axes, nice_ticks, tick_labels


def limit(run: Path, stamp: str, value: int) -> None:
    config = {"data": {"max_prompt_length": 128, "max_response_length": value}}
    launch_record.write_record(run, {"stamp": stamp, "config": config})


def test_only_a_step_whose_longest_reached_the_limit_had_responses_cut(tmp_path):
    """verl's clip_ratio (1.0: all as long as the longest) is the share cut there only."""

    def lengths(step: int, data: dict[str, Any]):  # the longest and clip_ratio of steps 5, 6
        longest, ratio = {5: (24.0, 0.25), 6: (23.0, 0.5)}.get(step, (12.0, 1.0))
        data["response_length/max"] = longest
        data["response_length/mean"] = min(data["response_length/mean"], longest)
        data["response_length/clip_ratio"] = ratio

    run, out = tmp_path / "run", tmp_path / "out"
    write_jsonl(run / "metrics" / "metrics-20261124T000000Z.jsonl", build_run(lengths))
    assert "response_cut_share" not in rs.analyse(run)[1].series  # no limit known: not derived
    report.generate(run, out)
    page = (out / "report.html").read_text()
    assert 'id="plot-response_cut_share"' in page and "response_cut_share" not in parse_svgs(page)
    assert "clip_ratio alone is the share as long as the step&#x27;s longest response" in page
    limit(run, "20261124T000000Z", 24)
    data, canon, _, summary = rs.analyse(run)
    assert data.config["max_response_length"] == 24
    assert {v for _, v in canon.series["response_length_clip_ratio"]} == {1.0, 0.25, 0.5}
    cut = dict(canon.series["response_cut_share"])
    assert len(cut) == len(canon.series["response_length_max"])
    assert cut.pop(5) == 0.25 and set(cut.values()) == {0.0}
    assert summary["metrics"]["response_cut_share"]["median"] == 0.0
    assert "data.max_response_length=24" in canon.source_keys["response_cut_share"]
    report.generate(run, out)
    page = (out / "report.html").read_text()
    assert "response_length_clip_ratio" not in parse_svgs(page)
    chart = page.split('id="plot-response_cut_share"', 1)[1].split("</svg>", 1)[0]
    zero = re.search(r'<line class="tick-y"[^>]*y1="([\d.]+)"[^>]*/><text[^>]*>0</text>', chart)
    points = re.search(r'data-series="cut \(raw\)"[^>]*points="([^"]+)"', chart).group(1).split()
    assert zero and sum(p.split(",")[1] != zero.group(1) for p in points) == 1
    limit(run, "20261124T010000Z", 48)  # the latest launch's limit
    assert rs.analyse(run)[0].config["max_response_length"] == 48


@pytest.mark.parametrize(
    "lo,hi",
    [(0.9996, 0.9999), (0.9999991, 0.9999999), (123456.1, 123456.4), (1.0e-4, 1.2e-4), (0, 1)],
)
def test_tick_labels_tell_close_values_apart(lo: float, hi: float):
    axes = Axes((0, 10), (lo, hi), False)
    ticks = nice_ticks(axes.y0, axes.y1)
    labels = tick_labels(ticks)
    assert len(set(labels)) == len(labels) >= 2, labels
    for tick, label in zip(ticks, labels, strict=True):  # and each reads back as its value
        assert float(label) == pytest.approx(tick, rel=1e-9, abs=1e-12)


def test_a_close_correlation_axis_on_the_page(tmp_path):

    def close(step: int, data: dict[str, Any]):
        data["training/rollout_actor_probs_pearson_corr"] = 0.9999991 + (step % 9) * 1e-7

    report.generate(write_jsonl(tmp_path / "m.jsonl", build_run(close)), tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    chart = page.split('id="plot-rollout_corr"', 1)[1].split("</svg>", 1)[0]
    labels = re.findall(r'<text class="tick-y"[^>]*>([^<]+)</text>', chart)
    assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
