"""The report's share of responses cut at the length limit (analysis/parse.py: from
response_length/max and the run's data.max_response_length; verl's response_length/clip_ratio is
the share as long as the batch's longest, docs/reading-a-ppo-run.md), and axis labels that tell
close values apart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from report_runs import build_run, parse_svgs, write_jsonl

from verl_gsm8k.common import launch_record
from verl_gsm8k.report import cli as report
from verl_gsm8k.runpage import summary as rs
from verl_gsm8k.svgplot.chart import tick_labels

LIMIT = 24


def run_dir(tmp_path: Path, lengths: dict[int, tuple[float, float]], limit: int | None) -> Path:
    """A run directory: build_run's metrics with each step's (response_length/max, clip_ratio)
    as verl logs them, and (unless ``limit`` is None) a launch record whose resolved config
    has data.max_response_length = ``limit``, written by the launcher's own writer."""

    def lengths_of(step: int, data: dict[str, Any]) -> None:
        longest, ratio = lengths.get(step, (12.0, 1.0))
        data["response_length/max"] = longest
        data["response_length/mean"] = min(data["response_length/mean"], longest)
        data["response_length/clip_ratio"] = ratio

    run = tmp_path / "run"
    write_jsonl(run / "metrics" / "metrics-20261124T000000Z.jsonl", build_run(lengths_of))
    if limit is not None:
        config = {"data": {"max_prompt_length": 128, "max_response_length": limit}}
        launch_record.write_record(run, {"stamp": "20261124T000000Z", "config": config})
    return run


def test_responses_all_below_the_limit_are_not_cut(tmp_path: Path) -> None:
    """Every response 12 tokens, the limit 24: verl logs clip_ratio 1.0 (all as long as the
    longest); none was cut."""
    data, canon, _, summary = rs.analyse(run_dir(tmp_path, {}, LIMIT))
    assert data.config["max_response_length"] == LIMIT
    assert {v for _, v in canon.series["response_length_clip_ratio"]} == {1.0}  # verl's figure
    cut = canon.series["response_cut_share"]
    assert len(cut) == len(canon.series["response_length_max"]) and {v for _, v in cut} == {0.0}
    assert summary["metrics"]["response_cut_share"]["median"] == 0.0
    assert "data.max_response_length=24" in canon.source_keys["response_cut_share"]


def test_a_step_that_reaches_the_limit_keeps_verls_share(tmp_path: Path) -> None:
    """When the longest response reached the limit, the batch was padded to the limit, so
    verl's ratio is the share cut."""
    _, canon, _, _ = rs.analyse(run_dir(tmp_path, {5: (24.0, 0.25), 6: (23.0, 0.5)}, LIMIT))
    cut = dict(canon.series["response_cut_share"])
    assert cut[5] == 0.25 and cut[6] == 0.0 and cut[7] == 0.0


def test_the_page_plots_the_cut_share_not_verls_figure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    report.generate(run_dir(tmp_path, {}, LIMIT), out)
    page = (out / "report.html").read_text(encoding="utf-8")
    svgs = parse_svgs(page)
    assert "response_cut_share" in svgs and "response_length_clip_ratio" not in svgs
    chart = page.split('id="plot-response_cut_share"', 1)[1].split("</svg>", 1)[0]
    zero = re.search(r'<line class="tick-y"[^>]*y1="([\d.]+)"[^>]*/><text[^>]*>0</text>', chart)
    points = re.search(r'data-series="cut"[^>]*points="([^"]+)"', chart).group(1).split()
    assert zero and {y for _, y in (p.split(",") for p in points)} == {zero.group(1)}  # all 0


def test_without_the_limit_nothing_is_derived(tmp_path: Path) -> None:
    _, canon, _, _ = rs.analyse(run_dir(tmp_path, {}, None))
    assert "response_cut_share" not in canon.series
    out = tmp_path / "out"
    report.generate(tmp_path / "run", out)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="plot-response_cut_share"' in page and "response_cut_share" not in parse_svgs(page)
    assert "clip_ratio alone is the share as long as the step&#x27;s longest response" in page


def test_the_limit_is_the_latest_launchs(tmp_path: Path) -> None:
    """The config a run has now, as the comparison reads it: its latest launch record's."""
    run = run_dir(tmp_path, {}, LIMIT)
    config = {"data": {"max_response_length": 48}}
    launch_record.write_record(run, {"stamp": "20261124T010000Z", "config": config})
    assert rs.analyse(run)[0].config["max_response_length"] == 48


@pytest.mark.parametrize(
    "lo,hi",
    [(0.9996, 0.9999), (0.9999991, 0.9999999), (123456.1, 123456.4), (1.0e-4, 1.2e-4), (0, 1)],
)
def test_tick_labels_tell_close_values_apart(lo: float, hi: float) -> None:
    from verl_gsm8k.svgplot.chart import Axes, nice_ticks

    axes = Axes((0, 10), (lo, hi), False)
    ticks = nice_ticks(axes.y0, axes.y1)
    labels = tick_labels(ticks)
    assert len(set(labels)) == len(labels) >= 2, labels
    for tick, label in zip(ticks, labels, strict=True):  # and each reads back as its value
        assert float(label) == pytest.approx(tick, rel=1e-9, abs=1e-12)


def test_a_close_correlation_axis_on_the_page(tmp_path: Path) -> None:
    """Pearson correlations of 0.9999991-0.9999999 (float32 engines in step) once read "1, 1, 1"."""

    def close(step: int, data: dict[str, Any]) -> None:
        data["training/rollout_actor_probs_pearson_corr"] = 0.9999991 + (step % 9) * 1e-7

    out = tmp_path / "out"
    report.generate(write_jsonl(tmp_path / "m.jsonl", build_run(close)), out)
    page = (out / "report.html").read_text(encoding="utf-8")
    chart = page.split('id="plot-rollout_corr"', 1)[1].split("</svg>", 1)[0]
    labels = re.findall(r'<text class="tick-y"[^>]*>([^<]+)</text>', chart)
    assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
