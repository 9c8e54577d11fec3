"""Tests of the PPO run report: verl_gsm8k/report/ (python -m verl_gsm8k.report) and its modules.

Real data: the two verl console logs under ../shared/data/verl-logs (or $SHARED_DATA_DIR/verl-logs).
Synthetic data: verl 0.9.1 file-logger JSONL built by tests/report_runs.py, healthy or with one
planted pathology. The checks of verl_gsm8k/analysis/learning.py: tests/test_report_learning.py.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import browser
import pytest
from browser import WINDOW, chart_titles, plot_series, png_size, render, require_chromium
from report_runs import (
    EXPLODING_CRITICS,
    HEALTHY_CRITICS,
    LOG_256,
    LOG_512,
    PHASES,
    STEP_OVERHEAD,
    STEPS,
    VAL_KEY,
    analyse_records,
    build_run,
    checks_fired,
    only,
    parse_svgs,
    write_jsonl,
)

from verl_gsm8k.analysis import checks as rc
from verl_gsm8k.analysis import finding as rf
from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.analysis import thresholds as rt
from verl_gsm8k.common import atomic_io
from verl_gsm8k.report import cli as report
from verl_gsm8k.runpage import summary as rs
from verl_gsm8k.svgplot import chart as svg_chart

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_runs(
    verl_logs_dir: Path,
) -> dict[str, tuple[rp.RunData, rp.Canonical, list[rf.Finding], dict[str, Any]]]:
    logs = verl_logs_dir
    return {name: rs.analyse(logs / name) for name in (LOG_512, LOG_256)}


# --------------------------------------------------------------------------------------------
# Real logs
# --------------------------------------------------------------------------------------------


def test_real_logs_parse_every_step_and_nothing_else(verl_logs_dir: Path, real_runs) -> None:
    logs = verl_logs_dir
    for name, (data, canon, _, summary) in real_runs.items():
        assert list(data.steps) == list(range(435)), name
        assert data.issues == [], name
        # Every step has the same 40 training keys; validation (and its timing) every 10 steps.
        # A model output read as metrics would add a step or a stray key.
        base = set(data.steps[1])
        assert len(base) == 40
        for step, values in data.steps.items():
            extra = set(values) - base
            assert base <= set(values), step
            if step % 10 == 9:
                assert extra == {"val/test_score/openai/gsm8k", "timing/testing"}, step
            else:
                assert extra == set(), step
        assert len(canon.series["score"]) == 435
        assert len(canon.series["val_acc"]) == 43
        assert summary["steps"] == {"count": 435, "first": 0, "last": 434, "gaps_before": []}
    # The 512-token log prints model text containing "step:" on two lines, none of them metrics.
    text = (logs / LOG_512).read_text(encoding="utf-8", errors="replace")
    with_step = [line for line in text.splitlines() if "step:" in line]
    assert len(with_step) == 437
    assert sum("first step:" in line or "step by step:" in line for line in with_step) == 2


def test_real_logs_best_and_final_validation(real_runs) -> None:
    val512 = real_runs[LOG_512][3]["validation"]
    assert val512["key"] == "val/test_score/openai/gsm8k"
    assert val512["best"] == {"value": 0.579, "step": 349, "also_at": []}
    assert val512["final"] == {"value": 0.543, "step": 429}
    val256 = real_runs[LOG_256][3]["validation"]
    assert val256["best"] == {"value": 0.538, "step": 199, "also_at": [419]}
    assert val256["final"] == {"value": 0.526, "step": 429}


def test_real_logs_vocabulary_maps_old_names(real_runs) -> None:
    _, canon, _, summary = real_runs[LOG_512]
    keys = {name: info["key"] for name, info in summary["metrics"].items()}
    assert keys["kl"] == "critic/kl"
    assert keys["entropy"] == "actor/entropy_loss"
    assert keys["val_acc"] == "val/test_score/openai/gsm8k"
    assert canon.step_time_derived
    # actor/lr(1e-4):0.010 means 1e-6
    assert summary["metrics"]["actor_lr"]["median"] == pytest.approx(1e-6)
    assert set(canon.phases) == {
        "gen",
        "ref",
        "values",
        "adv",
        "update_critic",
        "update_actor",
        "testing",
    }


def test_real_logs_time_breakdown_sums(verl_logs_dir: Path, real_runs) -> None:
    logs = verl_logs_dir
    for name, (_, canon, _, summary) in real_runs.items():
        tm = summary["time"]
        # Independent sum over every timing/<phase> value on the metric lines of the raw log.
        text = (logs / name).read_text(encoding="utf-8", errors="replace")
        metric_lines = [ln for ln in text.splitlines() if re.search(r"step:\d+ - timing/", ln)]
        assert len(metric_lines) == 435
        raw_total = sum(
            float(v) for ln in metric_lines for v in re.findall(r"timing/\w+:([\d.]+)", ln)
        )
        assert tm["wall_clock_s"] == pytest.approx(raw_total, rel=1e-9)
        phase_total = sum(p["total_s"] for p in tm["phases"].values())
        assert phase_total == pytest.approx(tm["wall_clock_s"], rel=1e-9)
        assert sum(p["share"] for p in tm["phases"].values()) == pytest.approx(1.0)
        assert tm["wall_clock_s"] == pytest.approx(
            tm["step_time_total_s"] + tm["phases"]["testing"]["total_s"]
        )
        # Per step: the phases inside the step add up to the step time.
        step_time = dict(canon.series["step_time"])
        inside = {s: 0.0 for s in step_time}
        for phase, points in canon.phases.items():
            if phase != "testing":
                for step, seconds in points:
                    inside[step] += seconds
        assert all(inside[s] == pytest.approx(step_time[s]) for s in step_time)
        assert "other" not in tm["phases"]
        # gen + update_actor + update_critic dominate these runs
        big = sum(tm["phases"][p]["share"] for p in ("gen", "update_actor", "update_critic"))
        assert 0.7 < big < 0.85
        # Estimated throughput (no perf/throughput in the old logs): batch 256 from the config.
        assert summary["throughput"]["estimated"]
        assert 800 < summary["throughput"]["tokens_per_s"] < 2000


def test_real_logs_raise_no_false_alarm(real_runs) -> None:
    """Both runs are healthy: accuracy rises from ~0 to 0.54-0.58 and plateaus, KL levels off
    at 0.2-0.3, entropy falls to ~12% of its start, length is stable, the value loss settles.
    No error or warning may fire. The accuracy check would only leave a note; with the 1-point
    bar both runs still gain a point within their last 100 steps, so it stays silent too."""
    for name, (_, _, findings, summary) in real_runs.items():
        assert [str(f) for f in findings if f.severity != "note"] == [], name
        assert summary["health_counts"]["error"] == 0
        assert summary["health_counts"]["warning"] == 0


def test_real_log_html_has_every_plot(verl_logs_dir: Path, real_runs, tmp_path: Path) -> None:
    logs = verl_logs_dir
    result = report.generate(logs / LOG_512, tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    svgs = parse_svgs(page)
    expected_435 = [
        "score",
        "kl",
        "entropy",
        "response_length",
        "vf_loss",
        "clipfrac",
        "grad_norm",
        "step_time",
        "throughput",
    ]
    for plot_id in expected_435:
        assert plot_id in svgs, plot_id
        assert svgs[plot_id]["data-points"] == "435", plot_id
        assert svgs[plot_id]["series"], plot_id
        for count, coords in svgs[plot_id]["series"]:
            assert count == coords and count > 0, plot_id
    assert svgs["val_acc"]["data-points"] == "43"
    assert svgs["val_acc"]["series"][0] == (43, 43)
    assert "best 0.579 @ 349" in page
    # Old logs have no response_length/clip_ratio, so no share cut at the limit (their config
    # dump does give the limit): a placeholder, not a broken plot.
    data, canon, _, _ = real_runs[LOG_512]
    assert data.config["max_response_length"] == 512 and "response_cut_share" not in canon.series
    assert 'id="plot-response_cut_share"' in page and "response_cut_share" not in svgs
    # Nor rollout/training mismatch, role-prefixed memory or val-aux keys (verl 0.9.1 only).
    for plot_id in ("rollout_mismatch", "rollout_corr", "memory", "val_aux"):
        assert f'id="plot-{plot_id}"' in page and plot_id not in svgs, plot_id
    assert result.summary["memory"] == {"gpu": {}, "host_used": None}
    # Step-time plot: one stacked layer per phase inside the step.
    layers = {name for name, _ in svgs["step_time"]["names"]}
    assert layers == {"gen", "ref", "values", "adv", "update_critic", "update_actor"}
    assert "time_share" in svgs
    # Self-contained: no external scripts, stylesheets or images.
    assert not re.search(r"<(script|link|img)\b", page)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["validation"]["best"]["step"] == 349
    assert summary == json.loads(json.dumps(result.summary))


def test_missing_chromium_skips_but_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no-chromium not installed"):
        browser.require_chromium()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=".ci/run installs it"):
        browser.require_chromium()


def test_real_log_html_renders_in_headless_chromium(
    verl_logs_dir: Path, real_runs, tmp_path: Path
) -> None:
    """The page as a browser lays it out: a full screenshot, and the curves read back from the
    DOM Chromium built land on the logged values (skipped without chromium, failed under CI)."""
    require_chromium()
    report.generate(verl_logs_dir / LOG_256, tmp_path / "out")
    dom, png = render(tmp_path / "out" / "report.html", tmp_path)
    assert png_size(png) == WINDOW == (1400, 2400)
    assert png.stat().st_size > 50_000  # a page full of curves, not a blank one
    assert "No check fired." in dom
    titles = chart_titles(dom)
    assert titles[0] == "Validation accuracy (val/test_score/openai/gsm8k)"
    assert "Responses cut at data.max_response_length (share)" in titles
    _, canon, _, _ = real_runs[LOG_256]
    drawn = plot_series(dom, "Validation accuracy")
    assert list(drawn) == ["val_acc"]
    logged = canon.series["val_acc"]
    assert len(drawn["val_acc"]) == len(logged) == 43
    for (x, y), (step, value) in zip(drawn["val_acc"], logged, strict=True):
        assert x == pytest.approx(step, abs=0.5) and y == pytest.approx(value, abs=0.002)
    # a chart with a raw and a smoothed line, and one on a log axis (the value loss)
    score = plot_series(dom, "Train score")
    assert set(score) == {"score (raw)", "score", "reward (raw)", "reward"}
    assert [round(x) for x, _ in score["score (raw)"]] == list(range(435))
    vf = plot_series(dom, "Value (critic) loss")["vf_loss (raw)"]
    assert vf[0][1] == pytest.approx(dict(canon.series["vf_loss"])[0], rel=0.01)
    assert plot_series(dom, "Responses cut at") == {}  # "not logged" placeholder
    with pytest.raises(KeyError):
        plot_series(dom, "no such chart")


# --------------------------------------------------------------------------------------------
# Synthetic runs: healthy and pathological
# --------------------------------------------------------------------------------------------


def test_synthetic_healthy_run_raises_nothing(tmp_path: Path) -> None:
    data, canon, findings, summary = analyse_records(tmp_path, build_run())
    assert findings == []
    assert list(data.steps) == list(range(STEPS + 1))
    assert summary["validation"]["key"] == VAL_KEY
    assert not canon.step_time_derived
    assert not summary["throughput"]["estimated"]
    # Phases: nested timing_s/agent_loop/... is not a phase; "other" is the uncovered overhead.
    tm = summary["time"]
    assert set(tm["phases"]) == set(PHASES) | {"other", "testing"}
    assert tm["phases"]["other"]["total_s"] == pytest.approx(STEP_OVERHEAD * STEPS)
    inside = sum(p["total_s"] for p in tm["phases"].values() if p["inside_step"])
    assert inside == pytest.approx(tm["step_time_total_s"])
    assert sum(p["share"] for p in tm["phases"].values()) == pytest.approx(1.0)
    assert tm["wall_clock_s"] == pytest.approx(inside + tm["phases"]["testing"]["total_s"])


def test_kl_explosion(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= 120:
            d["actor/reward_kl_penalty"] = 0.2 * 1.06 ** (step - 120)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    # The train score has plateaued by then (+0.025 over the last 100 steps) while the KL
    # multiplies: the learning check says that growth buys nothing (test_report_learning.py).
    assert checks_fired(findings) == {"kl_unbounded", "kl_without_score_gain"}
    hit = only(findings, "kl_unbounded")
    assert 100 <= hit.start_step <= 135 and hit.end_step == STEPS
    assert hit.evidence["block_medians"][-1] > 5


def test_kl_jump(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= 150:
            d["actor/reward_kl_penalty"] = 1.0 + 0.01 * (step % 3)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    assert checks_fired(findings) == {"kl_jump"}
    hit = only(findings, "kl_jump")
    # flagged from when the next-5-step median turns (2 steps early) until the previous-20-step
    # median has caught up (10 steps after)
    assert 147 <= hit.start_step <= 150 and 150 <= hit.end_step <= 160
    assert "step 148" in hit.message
    assert hit.evidence["after"] > 0.9 and hit.evidence["before"] < 0.25


def test_entropy_collapse(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= 100:
            d["actor/entropy"] = 0.15 * math.exp(-(step - 100) / 8)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    assert checks_fired(findings) == {"entropy_collapse"}
    hit = only(findings, "entropy_collapse")
    # 5% of the start (~0.45) is reached 13-14 steps after the drop begins at 0.15
    assert 105 <= hit.start_step <= 125 and hit.end_step == STEPS
    assert hit.evidence["lowest"] < hit.evidence["bar"]


def test_length_hacking(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= 100:
            d["response_length/mean"] = 260.0 * (1 + 0.02 * (step - 100))
            d["critic/score/mean"] += 0.002 * (step - 100)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    assert checks_fired(findings) == {"length_hacking"}
    hit = only(findings, "length_hacking")
    assert 85 <= hit.start_step <= 115 and hit.end_step == STEPS


def test_length_growth_without_reward_gain_is_not_hacking(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= 100:
            d["response_length/mean"] = 260.0 * (1 + 0.02 * (step - 100))
            d["critic/score/mean"] = 0.64 - 0.0005 * (step - 100) + 0.01 * math.sin(step)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    assert "length_hacking" not in checks_fired(findings)


def test_verl_091_memory_metrics_carry_the_role(tmp_path: Path) -> None:
    """verl 0.9.1 logs actor/perf/max_memory_allocated_gb (not perf/...): peaks per role."""
    records = build_run()
    data, canon, _, summary = analyse_records(tmp_path, records)
    gpu = summary["memory"]["gpu"]
    assert set(gpu) == {"actor", "critic"}
    assert gpu["actor"]["allocated"] == {
        "gb": pytest.approx(30.0 + 0.01 * STEPS),
        "step": STEPS,
        "key": "actor/perf/max_memory_allocated_gb",
    }
    assert gpu["actor"]["reserved"]["gb"] == pytest.approx(34.0 + 0.01 * STEPS)
    assert gpu["critic"]["allocated"]["gb"] == 12.0 and gpu["critic"]["reserved"]["gb"] == 14.0
    assert 79 < summary["memory"]["host_used"]["gb"] < 81
    text = report.terminal_summary(summary, None)
    assert "peak GPU memory     : actor 32.0 GiB (reserved 36.0), critic 12.0 GiB" in text
    svgs = parse_svgs(report.render_html("run", data, canon, [], {**summary, "generated_at": ""}))
    assert {name for name, _ in svgs["memory"]["names"]} == {
        "actor",
        "actor reserved",
        "critic",
        "critic reserved",
    }
    # An older log's unprefixed key is still shown, under a role it does not name.
    for record in records[1:]:
        data_ = record["data"]
        data_["perf/max_memory_allocated_gb"] = data_.pop("actor/perf/max_memory_allocated_gb")
        for key in [k for k in data_ if "/perf/" in k]:
            del data_[key]
    gpu = analyse_records(tmp_path / "old", records)[3]["memory"]["gpu"]
    assert list(gpu) == ["role not named (older verl)"]
    assert gpu["role not named (older verl)"]["allocated"]["gb"] == pytest.approx(32.0)


def test_val_aux_keys_of_the_reward_are_read(tmp_path: Path) -> None:
    _, canon, _, summary = analyse_records(tmp_path, build_run())
    for key, value in (("format", 0.97), ("pred_found", 0.99), ("clipped", 0.02)):
        info = summary["metrics"][f"val_{key}"]
        assert info["key"] == f"val-aux/openai/gsm8k/{key}/mean@1"
        assert info["points"] == STEPS // 10 and info["median"] == value
    assert len(canon.series["val_acc"]) == STEPS // 10 + 1  # step 0 has no val-aux keys


def test_rollout_mismatch_flagged_with_its_steps(tmp_path: Path) -> None:
    """Steps 120-149: vLLM samples with weights that no longer match the trainer's (e.g. a
    failed weight sync): probabilities drift apart, their correlation drops."""

    def mutate(step: int, d: dict[str, Any]) -> None:
        if 120 <= step < 150:
            d["training/rollout_actor_probs_pearson_corr"] = 0.93 + 0.005 * (step % 3)
            d["training/rollout_probs_diff_max"] = 0.9 + 0.01 * (step % 5)
            d["training/rollout_probs_diff_mean"] = 0.04

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    # the mean gap of 0.04 is also above verl's harmful level (tests/test_report_rollout_gap.py)
    assert checks_fired(findings) == {"rollout_mismatch", "rollout_gap"}
    hit = only(findings, "rollout_mismatch")
    # centered 10-step medians: flagged from half a window before to half a window after
    assert 115 <= hit.start_step <= 121 and 148 <= hit.end_step <= 154
    assert hit.metric == "rollout_probs_corr"
    assert hit.evidence["lowest_corr"] < 0.95
    assert hit.evidence["highest_diff_max"] > 0.85 and 0.2 < hit.evidence["diff_max_base"] < 0.3


def test_rollout_diff_max_jump_alone_is_flagged(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= 170:
            d["training/rollout_probs_diff_max"] = 0.95

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    hit = only(findings, "rollout_mismatch")
    assert hit.metric == "rollout_probs_diff_max"
    assert 164 <= hit.start_step <= 171 and hit.end_step == STEPS
    assert "lowest_corr" not in hit.evidence


def test_nan_and_null_values(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if 150 <= step <= 160:
            d["actor/pg_loss"] = float("nan")
        if step == 170:
            d["critic/vf_loss"] = None  # what orjson writes for NaN/inf
        if step == 171:
            d["actor/grad_norm"] = float("inf")

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    nan = [f for f in findings if f.check == "nan_inf"]
    assert [(f.start_step, f.end_step) for f in nan] == [(150, 160), (170, 171)]
    assert nan[0].evidence == {"keys": ["actor/pg_loss"], "steps": 11}
    assert nan[1].evidence["keys"] == ["actor/grad_norm", "critic/vf_loss"]
    assert all(f.severity == "error" for f in nan)
    turned = only(findings, "first_non_finite")  # where it turned, and that it came back
    assert (turned.start_step, turned.end_step) == (150, 171)
    assert turned.evidence == {"first_step": 150, "keys": ["actor/pg_loss"],
                               "last_finite_step": 149, "steps_not_finite": 13}  # fmt: skip
    assert "finite again from step 172" in turned.message
    assert checks_fired(findings) == {"nan_inf", "first_non_finite"}


def test_value_loss_explosion(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= 120:
            d["critic/vf_loss"] = 0.08 * 1.1 ** (step - 120)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    hit = only(findings, "value_loss_explosion")
    # 10x the earlier low (~0.06) is passed near step 120 + log(7.5)/log(1.1) ~ 141
    assert 135 <= hit.start_step <= 150 and hit.end_step == STEPS
    # ... and 5x the run's first value loss (~0.22) near step 120 + log(13.5)/log(1.1) ~ 147
    assert 144 <= only(findings, "critic_divergence").start_step <= 151
    assert checks_fired(findings) == {
        "value_loss_explosion",
        "value_loss_not_decreasing",
        "critic_divergence",
    }


def short_run(vf_loss: list[float], grad_norm: list[float]) -> list[dict[str, Any]]:
    """A healthy run's steps 0..len(vf_loss), its critic's value loss and grad norm replaced."""
    records = build_run()[: len(vf_loss) + 1]
    for record, loss, norm in zip(records[1:], vf_loss, grad_norm, strict=True):
        record["data"] |= {"critic/vf_loss": loss, "critic/grad_norm": norm}
    return records


@pytest.mark.parametrize(("run", "last"), [("first", 4), ("second", 4), ("third", 4),
                                           ("fourth", 2), ("fifth", 4)])  # fmt: skip
def test_an_exploding_critic_is_a_warning_naming_vf_loss(tmp_path: Path, run: str, last: int):
    """A critic learning rate of 1e-1: the value loss 11-58 x its start at step 2 (the fourth
    run's step 3 falls back to 2.7 x)."""
    findings = analyse_records(tmp_path, short_run(*EXPLODING_CRITICS[run]))[2]
    hit = only(findings, "critic_divergence")
    assert (hit.severity, hit.metric, hit.start_step, hit.end_step) == ("warning", "vf_loss", 2,
                                                                       last)  # fmt: skip
    assert hit.message.startswith("critic/vf_loss up to ")
    assert "critic/grad_norm there" in hit.message
    assert hit.evidence["peak"] / hit.evidence["start"] > 10
    assert checks_fired(findings) == {"critic_divergence"}


@pytest.mark.parametrize("run", sorted(HEALTHY_CRITICS))
def test_a_healthy_critic_of_a_short_run_raises_nothing(tmp_path: Path, run: str) -> None:
    assert analyse_records(tmp_path, short_run(*HEALTHY_CRITICS[run]))[2] == []


def test_a_critic_that_started_near_0_and_learns_stays_under_the_floor(tmp_path: Path) -> None:
    """Every reward 0 at first (the critic fits ~0, as the smoke runs' 0.005), then rewards vary
    and the loss rises to a 0/1 reward's level, 0.2: 40 x its start, healthy. The floor keeps
    it quiet; a factor alone would not."""

    def mutate(step: int, d: dict[str, Any]) -> None:
        d["critic/vf_loss"] = 0.005 if step < 20 else 0.2

    records = build_run(mutate)
    assert "critic_divergence" not in checks_fired(analyse_records(tmp_path / "floor", records)[2])
    no_floor = rt.Thresholds(critic_loss_floor=0.0)
    data = rp.load_run(write_jsonl(tmp_path / "m.jsonl", records))
    hit = only(rc.health_checks(data, rp.canonicalize(data), no_floor), "critic_divergence")
    assert hit.start_step == 20


def test_the_real_critics_stay_far_below_the_bar(real_runs) -> None:
    """The real 0.5B runs' value loss reaches at most 1.18 x its start (step 1 of the 512-token
    run): under a quarter of the factor."""
    t = rt.THRESHOLDS
    for name, (_, canon, _, _) in real_runs.items():
        assert rc.check_critic_divergence(canon, t) == [], name
        values = [v for _, v in canon.series["vf_loss"]]
        assert max(values[1:]) / values[0] < t.critic_start_factor / 4, name


def test_value_loss_not_decreasing(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        d["critic/vf_loss"] = 0.2 + 0.0005 * step + 0.01 * math.sin(step)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    assert checks_fired(findings) == {"value_loss_not_decreasing"}
    hit = only(findings, "value_loss_not_decreasing")
    assert (hit.start_step, hit.end_step) == (1, STEPS)


def test_clip_fraction_zero_and_high(tmp_path: Path) -> None:
    def zero(step: int, d: dict[str, Any]) -> None:
        if step >= 100:
            d["actor/pg_clipfrac"] = 0.0

    findings = analyse_records(tmp_path, build_run(zero))[2]
    assert checks_fired(findings) == {"clip_fraction_zero"}
    hit = only(findings, "clip_fraction_zero")
    assert 95 <= hit.start_step <= 105 and hit.end_step == STEPS

    def high(step: int, d: dict[str, Any]) -> None:
        if 50 <= step < 110:
            d["actor/pg_clipfrac"] = 0.35

    findings = analyse_records(tmp_path / "b", build_run(high))[2]
    assert checks_fired(findings) == {"clip_fraction_high"}
    hit = only(findings, "clip_fraction_high")
    assert 45 <= hit.start_step <= 55 and 104 <= hit.end_step <= 114


def test_clip_fraction_zero_on_a_converged_run_is_a_note(tmp_path: Path) -> None:
    """Every response already earns the top score: the updates are tiny because nothing is left
    to learn (the CPU GRPO learning runs end so), not because the update is broken."""

    def converged(step: int, d: dict[str, Any]) -> None:
        d.update({"critic/score/min": 0.0, "critic/score/max": 1.0})
        if step >= 100:
            d.update({"actor/pg_clipfrac": 0.0, "critic/score/mean": 0.97})

    findings = analyse_records(tmp_path, build_run(converged))[2]
    hit = only(findings, "clip_fraction_zero")
    assert hit.severity == "note" and "converged" in hit.message, str(hit)
    assert hit.evidence["train_score"] == pytest.approx(0.97)


def test_accuracy_flat_from_start_is_a_warning(tmp_path: Path) -> None:
    rng = random.Random(1)

    def mutate(step: int, d: dict[str, Any]) -> None:
        if VAL_KEY in d:
            d[VAL_KEY] = 0.30 + rng.uniform(-0.004, 0.004)
        d["critic/score/mean"] = 0.15 + rng.uniform(-0.01, 0.01)

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    hit = only(findings, "accuracy_flat")
    assert hit.severity == "warning" and hit.metric == "val_acc"
    assert (hit.start_step, hit.end_step) == (0, STEPS)


def test_accuracy_plateau_is_a_note(tmp_path: Path) -> None:
    def mutate(step: int, d: dict[str, Any]) -> None:
        if VAL_KEY in d:
            d[VAL_KEY] = min(0.30 + 0.004 * step, 0.50)  # rises until step 50, then flat

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    hit = only(findings, "accuracy_flat")
    assert hit.severity == "note"
    assert 40 <= hit.start_step <= 60 and hit.end_step == STEPS
    assert checks_fired(findings) == set()


def test_thresholds_are_tunable(tmp_path: Path) -> None:
    """A stricter entropy bar makes the healthy run's ordinary decline fire: proof the
    threshold is read from the dataclass, not hard-coded."""
    path = write_jsonl(tmp_path / "m.jsonl", build_run())
    strict = rt.Thresholds(entropy_collapse_frac=0.5)
    findings = rs.analyse(path, strict)[2]
    assert "entropy_collapse" in checks_fired(findings)


def test_checkpoint_evaluations_drawn_over_validation(tmp_path: Path) -> None:
    """RUN_DIR/checkpoint_eval/comparison.json: our reward on each evaluated checkpoint, drawn
    over verl's validation curve, with the largest gap between the two named."""
    run = tmp_path / "run"
    write_jsonl(run / "metrics" / "metrics-1.jsonl", build_run())
    evals_file = run / "checkpoint_eval" / "comparison.json"
    rows = [
        {"step": 0, "model": "base", "mode": "training", "accuracy": 0.35,
         "our_reward_accuracy": 0.28, "n": 50},
        {"step": 0, "model": "base", "mode": "evalscope", "accuracy": 0.40},  # other prompt
        {"step": 200, "model": "s200", "mode": "training", "accuracy": 0.6,
         "our_reward_accuracy": 0.55, "n": 50},
        {"step": 150, "model": "s150", "mode": "training", "accuracy": None, "error": "boom"},
    ]  # fmt: skip
    evals_file.parent.mkdir(parents=True)
    evals_file.write_text(json.dumps({"results": rows}), encoding="utf-8")
    result = report.generate(run, tmp_path / "out")
    evals = result.summary["checkpoint_evals"]
    assert [(r["step"], r["our_reward_accuracy"], r["accuracy"]) for r in evals["rows"]] == [
        (0, 0.28, 0.35),
        (200, 0.55, 0.6),
    ]
    assert evals["problem"] == "1 rows without a step or an accuracy, skipped"
    # first the checkpoint evaluations' problem; then the replay's (this run has no trace)
    assert result.issues[0] == f"{evals_file}: 1 rows without a step or an accuracy, skipped"
    assert all("no per-token trace" in i or "no rollout" in i for i in result.issues[1:])
    val = dict(result.summary["val_acc_by_step"])
    assert [p["step"] for p in evals["agreement"]["steps"]] == [0, 200]
    assert evals["agreement"]["largest_gap"]["gap"] == pytest.approx(0.28 - val[0])
    assert evals["agreement_text"] == (
        "our reward vs verl validation at 2 shared steps: largest gap -2.0 points (step 0)"
    )
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    svgs = parse_svgs(page)
    assert svgs["checkpoint_eval"]["names"] == [
        ("verl validation (during training)", "polyline"),
        ("our reward on the checkpoint", "polyline"),
        ("EvalScope (lenient)", "polyline"),
    ]
    assert svgs["checkpoint_eval"]["series"] == [(STEPS // 10 + 1,) * 2, (2, 2), (2, 2)]
    assert 'id="eval-agreement"' in page and 'id="checkpoint-evals"' in page
    text = report.terminal_summary(result.summary, None)
    assert "checkpoint evals    : 2 (our reward vs verl validation at 2 shared steps" in text
    # Not JSON: the report is still written, and says why the evaluations are missing.
    evals_file.write_text("{not json", encoding="utf-8")
    result = report.generate(run, tmp_path / "out")
    assert result.summary["checkpoint_evals"]["rows"] == []
    assert "not readable JSON" in result.issues[0]
    assert all("no per-token trace" in i or "no rollout" in i for i in result.issues[1:])
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "checkpoint_eval" not in parse_svgs(page) and "not readable JSON" in page
    # A run without the file: no section, and null in summary.json.
    evals_file.unlink()
    assert report.generate(run, tmp_path / "out").summary["checkpoint_evals"] is None


# --------------------------------------------------------------------------------------------
# Resumed runs and malformed input
# --------------------------------------------------------------------------------------------


def test_resumed_run_segments_merge_later_wins(tmp_path: Path) -> None:
    records = build_run()
    first = records[:131]  # steps 0..130; checkpoint at 100, crash after 130
    second: list[dict[str, Any]] = [{"step": 100, "data": {VAL_KEY: 0.777}}]  # resume validation
    for rec in records[101:]:
        data = dict(rec["data"])
        data["critic/score/mean"] = 10.0 + rec["step"]  # marks the re-done steps
        second.append({"step": rec["step"], "data": data})
    run = tmp_path / "run"
    # Written out of name order on purpose: order is by name (= launch time), not mtime.
    write_jsonl(run / "metrics" / "metrics-20250102T090000Z.jsonl", second)
    write_jsonl(run / "metrics" / "metrics-20250102T060000Z.jsonl", first)
    data, canon, findings, summary = rs.analyse(run)
    assert [Path(s).name for s in data.sources] == [
        "metrics-20250102T060000Z.jsonl",
        "metrics-20250102T090000Z.jsonl",
    ]
    assert list(data.steps) == list(range(STEPS + 1))
    score = dict(canon.series["score"])
    assert score[100] == pytest.approx(records[100]["data"]["critic/score/mean"])  # kept
    assert score[101] == 111.0 and score[130] == 140.0 and score[200] == 210.0  # later wins
    assert score[99] == pytest.approx(records[99]["data"]["critic/score/mean"])
    assert dict(canon.series["val_acc"])[100] == 0.777
    assert summary["validation"]["best"] == {"value": 0.777, "step": 100, "also_at": []}


def test_validation_problems_counted_from_the_run_dumps(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_jsonl(run / "metrics" / "metrics-1.jsonl", build_run()[:30])
    assert rp.count_val_problems(run) is None  # no validation/ folder
    rows = [{"input": f"q{i % 40}", "output": "x", "score": 1.0} for i in range(160)]  # n=4
    write_jsonl(run / "validation" / "10.jsonl", rows)
    # the newest dump is half written (a cut line): the larger count of the two newest wins
    (run / "validation" / "20.jsonl").write_text(
        '{"input": "q0", "score": 1.0}\n{"input": "q1", "sco', encoding="utf-8"
    )
    (run / "validation" / "notes.jsonl").write_text('{"input": "other"}\n', encoding="utf-8")
    assert rp.count_val_problems(run) == (40, str(run / "validation" / "10.jsonl"))
    data, canon, _, summary = rs.analyse(run)
    assert data.val_problems == canon.val_problems == summary["validation"]["problems"] == 40
    # a single metrics file does not tell
    assert rs.analyse(run / "metrics" / "metrics-1.jsonl")[3]["validation"]["problems"] is None


def test_truncated_last_line_and_non_numeric_value(tmp_path: Path) -> None:
    records = build_run()[:21]
    records[5]["data"]["actor/entropy"] = "n/a"
    path = write_jsonl(tmp_path / "m.jsonl", records)
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"step": 21, "data": {"critic/score/mean": 0.4')  # writer died mid-line
    data, canon, _, _ = rs.analyse(path)
    assert list(data.steps) == list(range(21))
    messages = [str(issue) for issue in data.issues]
    assert len(messages) == 2
    assert messages[0].startswith(f"{path}:6: non-numeric value ignored: actor/entropy='n/a'")
    assert messages[1].startswith(f"{path}:22: truncated last line")
    assert 5 not in dict(canon.series["entropy"]) and 4 in dict(canon.series["entropy"])
    assert 5 in dict(canon.series["score"])  # the rest of the bad line is kept


def test_console_log_strictness_and_formats(tmp_path: Path) -> None:
    esc = "\x1b[36m(TaskRunner pid=1234)\x1b[0m "
    lines = [
        "2025-01-01 INFO starting",
        esc + "step:0 - val-core/openai/gsm8k/acc/mean@1:np.float64(0.25)",
        esc + "step:1 - critic/score/mean:0.5 - actor/entropy:nan - actor/pg_clipfrac:0.003",
        esc + "Let's start with the first step: add 3 and 4",
        esc + "step:2 - Calculate: 5 + 3 = 8",  # model output that looks like a step line
        "step:3 - the answer:42 is right",
        esc + "step:2 - critic/score/mean:0.6 - actor/entropy:0.4 - timing_s/gen:12.5",
        "(TaskRunner pid=1234) step:3 - critic/score/mean:abc - actor/entropy:0.39",
        esc + "step:4 - critic/score/mean:0.7 - timing_s/gen:12.0 - actor/entr",
    ]
    path = tmp_path / "console.log"
    path.write_text("\n".join(lines), encoding="utf-8")
    data = rp.load_run(path)
    assert list(data.steps) == [0, 1, 2, 3, 4]
    assert data.steps[0] == {"val-core/openai/gsm8k/acc/mean@1": 0.25}
    assert math.isnan(data.steps[1]["actor/entropy"])
    assert data.steps[2] == {"critic/score/mean": 0.6, "actor/entropy": 0.4, "timing_s/gen": 12.5}
    assert data.steps[3] == {"actor/entropy": 0.39}
    assert data.steps[4] == {"critic/score/mean": 0.7, "timing_s/gen": 12.0}
    issues = [str(i) for i in data.issues]
    assert issues == [
        f"{path}:8: non-numeric value ignored: critic/score/mean=abc",
        f"{path}:9: line cut off after 2 fields, dropped 'actor/entr'",
    ]
    # A last line without its newline may end inside a value: that field is not trusted.
    path.write_text("\n".join(lines[:3]) + "\n" + esc + "step:5 - x/a:1.5 - x/b:0.12", "utf-8")
    data = rp.load_run(path)
    assert data.steps[5] == {"x/a": 1.5}
    assert [str(i) for i in data.issues] == [
        f"{path}:4: line cut off after 1 fields, dropped 'x/b:0.12'"
    ]


def test_empty_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    data = rp.load_run(empty)
    assert data.steps == {} and [str(i) for i in data.issues] == [
        f"{empty}: empty file, no metrics in it"
    ]
    assert report.main([str(empty), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(empty) in err[0] and "empty file" in err[0]
    assert not (tmp_path / "o" / "report.html").exists()

    # An empty segment next to a good one: reported, and the good one still used.
    run = tmp_path / "run"
    write_jsonl(run / "metrics" / "metrics-1.jsonl", build_run()[:30])
    (run / "metrics" / "metrics-2.jsonl").write_text("\n", encoding="utf-8")
    assert report.main([str(run), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "metrics-2.jsonl: empty file" in captured.err
    assert (run / "report" / "report.html").is_file()


def test_missing_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"verl_gsm8k.report: error: input not found: {tmp_path / 'nope'}"]


def test_failure_keeps_earlier_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", build_run())
    out = tmp_path / "out"
    report.generate(path, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"report.html", "summary.json"}

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_io.os, "replace", broken_replace)
    write_jsonl(path, build_run(seed=99))
    assert report.main([str(path), "--out", str(out)]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp files left either

    monkeypatch.undo()

    def broken_render(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(report, "render_html", broken_render)
    with pytest.raises(RuntimeError):
        report.generate(path, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# --------------------------------------------------------------------------------------------
# --follow and the command line
# --------------------------------------------------------------------------------------------


def test_follow_regenerates_until_max_refreshes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records = build_run()
    run = tmp_path / "run"
    seg = write_jsonl(run / "metrics" / "metrics-20250101T000000Z.jsonl", records[:50])
    sleeps: list[float] = []

    def fake_sleep(seconds: float) -> None:  # the run writes 50 more steps meanwhile
        sleeps.append(seconds)
        done = 50 * (len(sleeps) + 1)
        write_jsonl(seg, records[:done])

    monkeypatch.setattr(report.time, "sleep", fake_sleep)
    code = report.main([str(run), "--follow", "--interval", "5", "--max-refreshes", "3"])
    assert code == 0
    assert sleeps == [5.0, 5.0]
    out = capsys.readouterr().out
    progress = [ln for ln in out.splitlines() if "refresh" in ln]
    assert len(progress) == 3
    assert "50 steps (last 49)" in progress[0] and "150 steps (last 149)" in progress[2]
    summary = json.loads((run / "report" / "summary.json").read_text(encoding="utf-8"))
    assert summary["steps"]["count"] == 150
    page = (run / "report" / "report.html").read_text(encoding="utf-8")
    assert '<meta http-equiv="refresh" content="5">' in page


def test_follow_waits_for_first_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    seg = run / "metrics" / "metrics-1.jsonl"
    seg.parent.mkdir(parents=True)
    seg.write_text("", encoding="utf-8")  # launched, nothing logged yet
    monkeypatch.setattr(report.time, "sleep", lambda s: write_jsonl(seg, build_run()[:5]))
    assert report.main([str(run), "--follow", "--interval", "1", "--max-refreshes", "2"]) == 0
    out = capsys.readouterr().out
    assert "refresh 1: nothing written yet" in out and "refresh 2: 5 steps" in out


def test_follow_says_when_the_input_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A followed input that disappears (run directory cleaned up, file moved): the progress line
    says so and where the last report still is, instead of "nothing written yet"."""
    path = write_jsonl(tmp_path / "metrics.jsonl", build_run()[:30])
    out = tmp_path / "out"
    monkeypatch.setattr(report.time, "sleep", lambda s: path.unlink(missing_ok=True))
    code = report.main([str(path), "--out", str(out), "--follow", "--max-refreshes", "2"])
    assert code == 0
    captured = capsys.readouterr()
    progress = [ln for ln in captured.out.splitlines() if "refresh" in ln]
    assert "refresh 1: 30 steps" in progress[0]
    assert progress[1].endswith(
        f"refresh 2: input {path} is gone; the last report at {out / 'report.html'} is kept"
    )
    assert "nothing written yet" not in captured.out
    expected = f"verl_gsm8k.report: error: input not found: {path}"
    assert captured.err.strip().splitlines() == [expected]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["steps"]["count"] == 30

    # An earlier report on disk is kept (and said to be) while a new input has no metrics yet.
    path.write_text("", encoding="utf-8")
    monkeypatch.setattr(report.time, "sleep", lambda s: None)
    assert report.main([str(path), "--out", str(out), "--follow", "--max-refreshes", "1"]) == 1
    line = [ln for ln in capsys.readouterr().out.splitlines() if "refresh 1" in ln][0]
    assert line.endswith(
        f"refresh 1: no metrics could be read; the last report at {out / 'report.html'} is kept"
    )


# --------------------------------------------------------------------------------------------
# Long runs: every check linear in the number of steps, plots of bounded size
# --------------------------------------------------------------------------------------------

LONG = 60_000
HACK_FROM = 40_000  # a planted length-hacking stretch: length +60% and score +0.15 over 100 steps


def long_run_lines(fmt: str) -> list[str]:
    """A 60,000-step run (about 15 MB), healthy except for the planted length hacking."""
    rng = random.Random(3)
    lines = []
    for step in range(LONG):
        ramp = min(1.0, max(0.0, (step - HACK_FROM) / 100)) if step < HACK_FROM + 300 else 0.0
        data: dict[str, float] = {
            "critic/score/mean": round(
                0.15 + 0.4 * (1 - math.exp(-step / 400)) + 0.15 * ramp + rng.uniform(-0.02, 0.02),
                4,
            ),
            "actor/reward_kl_penalty": round(0.2 * (1 - math.exp(-step / 600)), 4),
            "actor/entropy": round(0.08 + 0.4 * math.exp(-step / 500) + rng.uniform(0, 0.004), 4),
            "actor/pg_clipfrac": round(0.004 * (1 + rng.uniform(-0.3, 0.3)), 5),
            "critic/vf_loss": round(0.05 + 0.15 * math.exp(-step / 20_000), 4),
            "response_length/mean": round(
                260 * (1 + 0.6 * ramp) * (1 + rng.uniform(-0.04, 0.04)), 2
            ),
            "timing_s/gen": 20.0,
            "timing_s/update_actor": 18.0,
            "timing_s/step": 40.0,
        }
        if step % 10 == 0:
            data[VAL_KEY] = round(0.3 + 0.3 * (1 - math.exp(-step / 300)), 4)
        if fmt == "jsonl":
            lines.append(json.dumps({"step": step, "data": data}))
        else:
            lines.append(f"step:{step} - " + " - ".join(f"{k}:{v}" for k, v in data.items()))
    return lines


@pytest.mark.parametrize("fmt", ["console", "jsonl"])
def test_long_run_report_is_fast_and_bounded(tmp_path: Path, fmt: str) -> None:
    """The whole report (parse, checks, plots, write) of 60,000 steps. The length-hacking check
    used to compare every step with every earlier one: about two minutes for this log. The
    bound is a regression guard for a slow 2-core machine, not a benchmark."""
    path = tmp_path / ("run.jsonl" if fmt == "jsonl" else "console.log")
    path.write_text("\n".join(long_run_lines(fmt)) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "verl_gsm8k.report", str(path), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"report of a {LONG}-step {fmt} run took more than 30 s")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["steps"] == {"count": LONG, "first": 0, "last": LONG - 1, "gaps_before": []}
    assert summary["validation"]["points"] == LONG // 10
    warnings = [f for f in summary["health"] if f["severity"] != "note"]
    assert [f["check"] for f in warnings] == ["length_hacking"], warnings
    assert HACK_FROM - 20 <= warnings[0]["start_step"] <= HACK_FROM + 60
    assert HACK_FROM + 100 <= warnings[0]["end_step"] <= HACK_FROM + 300
    # Plots are downsampled: every series draws at most MAX_DRAWN points, keeping the spikes.
    page = (out / "report.html").read_text(encoding="utf-8")
    assert len(page) < 1_000_000
    svgs = parse_svgs(page)
    assert svgs["score"]["data-points"] == str(LONG)
    assert svgs["val_acc"]["data-points"] == str(LONG // 10)
    for plot_id, svg in svgs.items():
        for count, coords in svg["series"]:
            assert count == coords and 0 < count <= svg_chart.MAX_DRAWN, plot_id
    rise = re.search(r"\(\+(\d+)%\) while score", warnings[0]["message"])
    assert rise and 40 <= int(rise.group(1)) <= 60, warnings[0]["message"]


def test_checks_stay_linear_with_many_findings() -> None:
    """Checks used to rescan the whole run for every range they report: 60,000 steps with a NaN
    every fourth step and an entropy flickering below its bar took minutes."""
    data = rp.RunData()
    for step in range(LONG):
        entropy = 0.4 if step < 20 or (step // 10) % 2 else 0.001
        data.merge(
            step,
            {
                "actor/entropy": entropy,
                "actor/grad_norm": math.nan if step % 4 == 3 else 1.0,
                "actor/pg_clipfrac": 0.0 if (step // 40) % 2 else 0.3,
                "critic/vf_loss": 0.1 if (step // 20) % 2 else 50.0,
            },
        )
    started = time.monotonic()
    canon = rp.canonicalize(data)
    findings = rc.health_checks(data, canon)
    assert time.monotonic() - started < 20
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.check] = counts.get(finding.check, 0) + 1
    # one finding per NaN step (never two in a row), one per 40-step block of each clip extreme,
    # about one per 20-step entropy cycle and per 40-step value-loss cycle
    assert counts["nan_inf"] == LONG // 4
    assert counts["clip_fraction_zero"] == counts["clip_fraction_high"] == LONG // 80
    assert LONG // 20 - 10 <= counts["entropy_collapse"] <= LONG // 20
    assert LONG // 40 - 10 <= counts["value_loss_explosion"] <= LONG // 40


def test_cli_subprocess_on_real_log(verl_logs_dir: Path, tmp_path: Path) -> None:
    logs = verl_logs_dir
    out = tmp_path / "r512"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_gsm8k.report",
            str(logs / LOG_512),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "best val accuracy   : 0.579 at step 349" in proc.stdout
    assert "final val accuracy  : 0.543 at step 429" in proc.stdout
    assert "steps               : 435 (0-434)" in proc.stdout
    assert "health              : 0 errors, 0 warnings, 0 notes" in proc.stdout
    assert re.search(r"time share\s+: gen \d+\.\d% \| ref", proc.stdout)
    assert (out / "report.html").is_file() and (out / "summary.json").is_file()
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))


def test_cli_help_and_missing_path_subprocess(tmp_path: Path) -> None:
    helptext = subprocess.run(
        [sys.executable, "-m", "verl_gsm8k.report", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in ("--out", "--follow", "--interval", "--max-refreshes", "INPUT"):
        assert flag in helptext
    proc = subprocess.run(
        [sys.executable, "-m", "verl_gsm8k.report", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "input not found" in proc.stderr


def test_default_out_dirs(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "run" / "metrics" / "metrics-1.jsonl", build_run()[:20])
    assert report.default_out_dir(tmp_path / "run") == tmp_path / "run" / "report"
    assert report.default_out_dir(path) == path.parent / "metrics-1-report"
    copy = tmp_path / "x.log"
    shutil.copy(path, copy)  # content sniffing: a .log holding JSON lines is read as JSONL
    assert rp.load_run(copy).formats == ["jsonl"]


def test_docs_threshold_table_matches_dataclass() -> None:
    """The thresholds live in analysis/thresholds.py (Thresholds); the docs repeat them."""
    text = (ROOT / "docs" / "reading-a-ppo-run.md").read_text(encoding="utf-8")
    documented = {name: float(value) for name, value in re.findall(r"`(\w+)`=([\d.]+)", text)}
    for name, value in vars(rt.THRESHOLDS).items():
        assert name in documented, f"{name} missing from docs/reading-a-ppo-run.md"
        assert documented[name] == pytest.approx(value), name


@pytest.mark.parametrize("count", [1, 2, 3, 9, 25])
def test_short_runs_render(tmp_path: Path, count: int) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", build_run()[:count])
    result = report.generate(path, tmp_path / "out")
    assert result.summary["steps"]["count"] == count
    assert (tmp_path / "out" / "report.html").stat().st_size > 1000


def test_arbitrary_values_never_break_the_report(tmp_path: Path) -> None:
    """Any mix of numbers (huge, negative, zero, NaN, inf, null) and steps still gives valid
    HTML and strict JSON."""
    hypothesis = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    keys = [
        "critic/score/mean",
        "actor/reward_kl_penalty",
        "actor/entropy",
        "critic/vf_loss",
        "actor/pg_clipfrac",
        "response_length/mean",
        "timing_s/step",
        "timing_s/gen",
        "perf/throughput",
        "perf/total_num_tokens",
        VAL_KEY,
    ]
    value = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**6), 10**6),
        st.none(),
    )
    record = st.tuples(st.integers(0, 60), st.dictionaries(st.sampled_from(keys), value))
    counter = iter(range(10**6))

    @hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @hypothesis.given(st.lists(record, min_size=1, max_size=60))
    def check(rows: list[tuple[int, dict[str, Any]]]) -> None:
        out = tmp_path / f"case{next(counter)}"
        lines = [json.dumps({"step": step, "data": data}) for step, data in rows]
        path = out / "m.jsonl"
        out.mkdir()
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        result = report.generate(path, out / "report")
        summary_text = (out / "report" / "summary.json").read_text(encoding="utf-8")
        json.loads(summary_text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
        assert result.summary["steps"]["count"] == len({step for step, _ in rows})
        parse_svgs((out / "report" / "report.html").read_text(encoding="utf-8"))

    check()
