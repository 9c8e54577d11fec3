"""python -m verl_gsm8k.report on the two real verl logs and report_runs.py's verl 0.9.1 runs."""

import json
import math
import random
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import browser
import pytest
import report_runs as rr
from browser import WINDOW, chart_titles, plot_series, png_size, render
from helpers import capture
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.common import atomic_io
from verl_gsm8k.guard.thresholds import THRESHOLDS
from verl_gsm8k.report import cli as report
from verl_gsm8k.runpage import summary as rs
from verl_gsm8k.svgplot import chart as svg_chart


@pytest.fixture(scope="module")
def real_runs(verl_logs_dir: Path) -> dict[str, tuple]:
    return {name: rs.analyse(verl_logs_dir / name) for name in (rr.LOG_512, rr.LOG_256)}


def test_real_logs_are_read_step_by_step_and_summed(verl_logs_dir, real_runs):
    """No model output read as a step; the phases add up to the log's timings; no alarm."""
    for name, (data, canon, findings, summary) in real_runs.items():
        assert list(data.steps) == list(range(435)) and data.issues == [], name
        base = set(data.steps[1])  # 40 training keys; validation every 10
        assert len(base) == 40
        for step, values in data.steps.items():
            val = {"val/test_score/openai/gsm8k", "timing/testing"} if step % 10 == 9 else set()
            assert set(values) == base | val, step
        assert summary["steps"] == {"count": 435, "first": 0, "last": 434, "gaps_before": []}
        keys = {name: info["key"] for name, info in summary["metrics"].items()}
        assert (keys["kl"], keys["entropy"]) == ("critic/kl", "actor/entropy_loss")
        assert summary["metrics"]["actor_lr"]["median"] == pytest.approx(1e-6)  # lr(1e-4):0.01
        assert canon.step_time_derived and set(canon.phases) == {
            "gen", "ref", "values", "adv", "update_critic", "update_actor", "testing"}  # fmt: skip
        text = (verl_logs_dir / name).read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if re.search(r"step:\d+ - timing/", ln)]
        logged = sum(float(v) for ln in lines for v in re.findall(r"timing/\w+:([\d.]+)", ln))
        tm, phases = summary["time"], summary["time"]["phases"]
        total = (tm["wall_clock_s"], sum(p["total_s"] for p in phases.values()),
                 tm["step_time_total_s"] + phases["testing"]["total_s"])  # fmt: skip
        assert total == pytest.approx((logged,) * 3, rel=1e-9)
        assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0)
        assert "other" not in phases  # the step time is the phases' sum here
        big = sum(phases[p]["share"] for p in ("gen", "update_actor", "update_critic"))
        assert 0.7 < big < 0.85
        assert summary["throughput"]["estimated"]  # batch 256 from the config dump
        assert 800 < summary["throughput"]["tokens_per_s"] < 2000
        assert [str(f) for f in findings if f.severity != "note"] == [], name  # judge_run's too
        kl, entropy = ([v for _, v in canon.series[k]] for k in ("kl", "entropy"))
        assert max(kl) > 0.2 and min(entropy) < 0.06
        assert summary["thresholds"] == asdict(THRESHOLDS)
        vf_loss = [v for _, v in canon.series["vf_loss"]]  # at most 1.18 x its start
        assert max(vf_loss[1:]) / vf_loss[0] < THRESHOLDS.critic_loss_factor / 4, name
    val256 = real_runs[rr.LOG_256][3]["validation"]  # the 512 log's: in the page test
    assert (val256["best"], val256["final"]) == ({"value": 0.538, "step": 199, "also_at": [419]},
                                                 {"value": 0.526, "step": 429})  # fmt: skip
    # two lines of the 512 log's model text hold "step:" and are no metrics
    text = (verl_logs_dir / rr.LOG_512).read_text(errors="replace")
    assert sum("first step:" in ln or "step by step:" in ln for ln in text.splitlines()) == 2


def test_real_log_page_has_every_chart(verl_logs_dir, real_runs, tmp_path, capsys):
    """In Chromium the curves read back from the DOM land on the logged values."""
    out = tmp_path / "r512"
    assert report.main([str(verl_logs_dir / rr.LOG_512), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.err == ""
    for line in ("best val accuracy   : 0.579 at step 349", "steps               : 435 (0-434)",
                 "final val accuracy  : 0.543 at step 429",
                 "health              : 0 errors, 0 warnings, 0 notes"):  # fmt: skip
        assert line in printed.out, line
    assert re.search(r"time share\s+: gen \d+\.\d% \| ref", printed.out)
    page = (out / "report.html").read_text()
    svgs = rr.parse_svgs(page)
    for plot_id in ("score", "kl", "entropy", "response_length", "vf_loss", "clipfrac",
                    "grad_norm", "step_time", "throughput"):  # fmt: skip
        assert svgs[plot_id]["data-points"] == "435" and svgs[plot_id]["series"], plot_id
        assert all(count == coords > 0 for count, coords in svgs[plot_id]["series"]), plot_id
    assert "best 0.579 @ 349" in page
    # the old logs lack verl 0.9.1's keys: placeholders, not broken charts
    data, canon = real_runs[rr.LOG_512][:2]
    assert data.config["max_response_length"] == 512
    for plot_id in ("response_cut_share", "rollout_mismatch", "rollout_corr", "memory", "val_aux"):
        assert f'id="plot-{plot_id}"' in page and plot_id not in svgs, plot_id
    layers = {name for name, _ in svgs["step_time"]["names"]}
    assert layers == {"gen", "ref", "values", "adv", "update_critic", "update_actor"}
    assert "time_share" in svgs and not re.search(r"<(script|link|img)\b", page)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory"] == {"gpu": {}, "host_used": None}
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "summary.json"]
    dom, png = render(out / "report.html", tmp_path)
    assert png_size(png) == WINDOW and png.stat().st_size > 50_000  # curves, not a blank page
    assert "No check fired." in dom
    titles = chart_titles(dom)
    assert titles[0] == "Validation accuracy (val/test_score/openai/gsm8k)"
    drawn = plot_series(dom, "Validation accuracy")
    assert list(drawn) == ["val_acc"] and len(drawn["val_acc"]) == 43
    for (x, y), (step, value) in zip(drawn["val_acc"], canon.series["val_acc"], strict=True):
        assert x == pytest.approx(step, abs=0.5) and y == pytest.approx(value, abs=0.002)
    score = plot_series(dom, "Train score")  # a raw and a smoothed line
    assert set(score) == {"score (raw)", "score", "reward (raw)", "reward"}
    assert [round(x) for x, _ in score["score (raw)"]] == list(range(435))
    vf = plot_series(dom, "Value (critic) loss")["vf_loss (raw)"]  # a log axis
    assert vf[0][1] == pytest.approx(dict(canon.series["vf_loss"])[0], rel=0.01)
    with pytest.raises(KeyError):
        plot_series(dom, "no such chart")


def test_missing_chromium_skips_but_fails_under_ci(tmp_path, monkeypatch):
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no-chromium not installed"):
        browser.require_chromium()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=".ci/run installs it"):
        browser.require_chromium()


def svgs_of(canon, summary: dict) -> dict:
    return rr.parse_svgs(report.render_html("run", canon, [], {**summary, "generated_at": ""}))


def test_synthetic_run_phases_memory_and_val_aux(tmp_path):
    records = rr.build_run()
    data, canon, findings, summary = rr.analyse_records(tmp_path, records)
    assert findings == [] and list(data.steps) == list(range(rr.STEPS + 1))
    assert not canon.step_time_derived and not summary["throughput"]["estimated"]
    tm = summary["time"]
    assert set(tm["phases"]) == set(rr.PHASES) | {"other", "testing"}
    assert tm["phases"]["other"]["total_s"] == pytest.approx(rr.STEP_OVERHEAD * rr.STEPS)
    inside = sum(p["total_s"] for p in tm["phases"].values() if p["inside_step"])
    assert inside == pytest.approx(tm["step_time_total_s"])
    assert tm["wall_clock_s"] == pytest.approx(inside + tm["phases"]["testing"]["total_s"])
    gpu = summary["memory"]["gpu"]
    assert gpu["actor"]["allocated"] == {"gb": pytest.approx(30.0 + 0.01 * rr.STEPS),
                                         "step": rr.STEPS,
                                         "key": "actor/perf/max_memory_allocated_gb"}  # fmt: skip
    assert (gpu["critic"]["allocated"]["gb"], gpu["critic"]["reserved"]["gb"]) == (12.0, 14.0)
    assert 79 < summary["memory"]["host_used"]["gb"] < 81
    text = report.terminal_summary(summary, None)
    assert "peak GPU memory     : actor 32.0 GiB (reserved 36.0), critic 12.0 GiB" in text
    for key, value in (("format", 0.97), ("pred_found", 0.99), ("clipped", 0.02)):
        info = summary["metrics"][f"val_{key}"]
        assert info["key"] == f"val-aux/openai/gsm8k/{key}/mean@1"
        assert info["points"] == rr.STEPS // 10 and info["median"] == value
    svgs = svgs_of(canon, summary)
    assert {n for n, _ in svgs["memory"]["names"]} == {
        "actor", "actor reserved", "critic", "critic reserved"}  # fmt: skip
    assert len(svgs["val_aux"]["names"]) == 3
    assert "tools" not in svgs  # no tool launch: a note, no chart
    shares = {"called": 0.5, "errors": 0.1, "acc_called": 0.4, "acc_not_called": 0.2}
    for step, record in enumerate(records[1:], 1):  # a tool launch's (TOOLS): drawn per step
        record["data"] |= {f"tools/{k}": v for k, v in shares.items()} | {
            "num_turns/mean": 3.0 + step % 2}  # fmt: skip
    canon, _, summary = rr.analyse_records(tmp_path / "tools", records)[1:]
    svgs = svgs_of(canon, summary)
    assert {n for n, _ in svgs["tools"]["names"]} >= {"called", "errors", "accuracy, called",
                                                      "accuracy, not called"}  # fmt: skip
    assert canon.series["num_turns"][:2] == [(1, 4.0), (2, 3.0)]
    for record in records[1:]:
        d = record["data"]
        d["perf/max_memory_allocated_gb"] = d.pop("actor/perf/max_memory_allocated_gb")
        for key in [k for k in d if "/perf/" in k]:
            del d[key]
    gpu = rr.analyse_records(tmp_path / "old", records)[3]["memory"]["gpu"]
    assert list(gpu) == ["role not named (older verl)"]
    assert gpu["role not named (older verl)"]["allocated"]["gb"] == pytest.approx(32.0)


def test_checkpoint_evaluations_drawn_over_validation(tmp_path):
    run, out = rr.write_run(tmp_path / "run"), tmp_path / "out"
    evals_file = rr.write_evals(run, [
        {"step": 0, "model": "base", "mode": "training", "accuracy": 0.35,
         "our_reward_accuracy": 0.28, "n": 50},
        {"step": 0, "model": "base", "mode": "evalscope", "accuracy": 0.40},  # another prompt
        {"step": 200, "model": "s200", "mode": "training", "accuracy": 0.6,
         "our_reward_accuracy": 0.55, "n": 50},
        {"step": 150, "model": "s150", "mode": "training", "accuracy": None, "error": "boom"},
    ])  # fmt: skip
    result = report.generate(run, out)
    evals = result.summary["checkpoint_evals"]
    assert [(r["step"], r["our_reward_accuracy"], r["accuracy"]) for r in evals["rows"]] == [
        (0, 0.28, 0.35), (200, 0.55, 0.6)]  # fmt: skip
    assert result.issues[0] == f"{evals_file}: 1 rows without a step or an accuracy, skipped"
    val = dict(result.summary["val_acc_by_step"])
    assert [p["step"] for p in evals["agreement"]["steps"]] == [0, 200]
    assert evals["agreement"]["largest_gap"]["gap"] == pytest.approx(0.28 - val[0])
    assert evals["agreement_text"] == (
        "our reward vs verl validation at 2 shared steps: largest gap -2.0 points (step 0)"
    )
    page = (out / "report.html").read_text()
    chart = rr.parse_svgs(page)["checkpoint_eval"]
    assert [n for n, _ in chart["names"]] == [
        "verl validation (during training)", "our reward on the checkpoint", "EvalScope (lenient)"
    ]  # fmt: skip
    assert chart["series"] == [(rr.STEPS // 10 + 1,) * 2, (2, 2), (2, 2)]
    assert 'id="eval-agreement"' in page and 'id="checkpoint-evals"' in page
    text = report.terminal_summary(result.summary, None)
    assert "checkpoint evals    : 2 (our reward vs verl validation at 2 shared steps" in text
    evals_file.write_text("{not json")  # still written, and says why
    result = report.generate(run, out)
    assert result.summary["checkpoint_evals"]["rows"] == [] and "not readable" in result.issues[0]
    page = (out / "report.html").read_text()
    assert "checkpoint_eval" not in rr.parse_svgs(page) and "not readable JSON" in page
    evals_file.unlink()  # and no guard file either: nothing of theirs shown
    s = report.generate(run, out).summary
    assert s["checkpoint_evals"] is s["best_checkpoint"] is s["best_checkpoint_problem"] is None
    assert s["watchdog_trips"] == s["validation"]["not_finite_steps"] == []
    page = (out / "report.html").read_text()
    for marker in ("watchdog-trips", "best-checkpoint", 'id="turned"', "kept best checkpoint"):
        assert marker not in page


def test_a_resumed_run_is_its_launches_merged_the_later_winning(tmp_path):
    records = rr.build_run()
    second: list[dict[str, Any]] = [{"step": 100, "data": {rr.VAL_KEY: 0.777}}]  # its validation
    for rec in records[101:]:  # the steps after the checkpoint at 100, done again
        redone = {**rec["data"], "critic/score/mean": 10.0 + rec["step"]}
        second.append({"step": rec["step"], "data": redone})
    run = tmp_path / "run"
    # written out of name order: the name's order (the launch's time) counts
    rr.write_jsonl(run / "metrics" / "metrics-20250102T090000Z.jsonl", second)
    rr.write_jsonl(run / "metrics" / "metrics-20250102T060000Z.jsonl", records[:131])
    data, canon, _, summary = rs.analyse(run)
    assert [Path(s).name for s in data.sources] == [
        "metrics-20250102T060000Z.jsonl", "metrics-20250102T090000Z.jsonl"]  # fmt: skip
    score = dict(canon.series["score"])
    assert score[100] == pytest.approx(records[100]["data"]["critic/score/mean"])  # kept
    assert (score[101], score[130], score[200]) == (111.0, 140.0, 210.0)  # the later wins
    assert summary["validation"]["best"] == {"value": 0.777, "step": 100, "also_at": []}


def test_validation_problems_counted_from_the_run_dumps(tmp_path):
    run = rr.write_run(tmp_path / "run", rr.build_run()[:30])
    assert rp.count_val_problems(run) is None  # no validation/ folder
    rows = [{"input": f"q{i % 40}", "output": "x", "score": 1.0} for i in range(160)]  # n=4
    rr.write_jsonl(run / "validation" / "10.jsonl", rows)
    # the newest dump is half written: the larger count of the two newest wins
    (run / "validation" / "20.jsonl").write_text('{"input": "q0"}\n{"input": "q1", "sco')
    (run / "validation" / "notes.jsonl").write_text('{"input": "other"}\n')
    assert rp.count_val_problems(run) == (40, str(run / "validation" / "10.jsonl"))
    data, canon, _, summary = rs.analyse(run)
    assert data.val_problems == canon.val_problems == summary["validation"]["problems"] == 40
    assert rs.analyse(run / rr.SEGMENT)[3]["validation"]["problems"] is None


def test_bad_lines_are_one_warning_each_and_the_rest_is_read(tmp_path, capsys):
    records = rr.build_run()[:21]
    records[5]["data"]["actor/entropy"] = "n/a"
    records[7]["data"]["actor/entropy"] = 10**400
    run = tmp_path / "run"
    path = rr.write_jsonl(run / "metrics" / "metrics-1.jsonl", records)
    with path.open("a") as handle:
        handle.write('{"step": 1' + "0" * 400 + ', "data": {}}\n')
        handle.write('{"step": 21, "data": {"critic/score/mean": 0.4')  # the writer died here
    (run / "metrics" / "metrics-2.jsonl").write_text("\n")
    assert report.main([str(run), "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "metrics-" in line]
    where = [f"{path}:6", f"{path}:22", f"{path}:23", str(run / "metrics" / "metrics-2.jsonl")]
    assert [line.split(": ", 3)[2] for line in warned] == where
    assert "actor/entropy='n/a'" in warned[0] and "truncated last line" in warned[2]
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert summary["steps"]["count"] == 21 and "entropy" in summary["metrics"]
    assert any(f["check"] == "non_finite" and f["start_step"] == 7 for f in summary["health"])
    empty = rr.write_jsonl(tmp_path / "empty.jsonl", [])
    assert report.main([str(empty), "--out", str(tmp_path / "o")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(empty) in line and "empty file" in line
    assert not (tmp_path / "o" / "report.html").exists()


def test_console_log_strictness(tmp_path):
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
    path.write_text("\n".join(lines))
    data = rp.load_run(path)
    assert list(data.steps) == [0, 1, 2, 3, 4] and math.isnan(data.steps[1]["actor/entropy"])
    assert data.steps[0] == {"val-core/openai/gsm8k/acc/mean@1": 0.25}
    assert data.steps[2] == {"critic/score/mean": 0.6, "actor/entropy": 0.4, "timing_s/gen": 12.5}
    assert data.steps[3] == {"actor/entropy": 0.39}
    assert data.steps[4] == {"critic/score/mean": 0.7, "timing_s/gen": 12.0}
    assert data.issues == [
        f"{path}:8: non-numeric value ignored: critic/score/mean='abc'",
        f"{path}:9: line cut off after 2 fields, dropped 'actor/entr'",
    ]
    # a last line without its newline may end inside a value
    path.write_text("\n".join(lines[:3]) + "\n" + esc + "step:5 - x/a:1.5 - x/b:0.12", "utf-8")
    data = rp.load_run(path)
    assert data.steps[5] == {"x/a": 1.5}
    assert data.issues == [f"{path}:4: line cut off after 1 fields, dropped 'x/b:0.12'"]


def test_the_command_line_and_its_exit_statuses(tmp_path):
    for flag in ("--out", "--follow", "--interval", "--max-refreshes", "INPUT"):
        assert flag in report.build_parser().format_help()
    missing = tmp_path / "missing"
    done = capture([sys.executable, "-m", "verl_gsm8k.report", missing], 2)
    assert done.stderr == f"verl_gsm8k.report: error: input not found: {missing}\n"
    path = rr.write_jsonl(tmp_path / "run" / "metrics" / "metrics-1.jsonl", rr.build_run()[:2])
    assert report.default_out_dir(tmp_path / "run") == tmp_path / "run" / "report"
    assert report.default_out_dir(path) == path.parent / "metrics-1-report"
    log = tmp_path / "x.log"
    log.write_text(path.read_text())  # read by its content: a .log of JSON lines is JSONL
    assert rp.load_run(log).formats == ["jsonl"]


def test_failure_keeps_earlier_report(tmp_path, monkeypatch):
    path = rr.write_jsonl(tmp_path / "m.jsonl", rr.build_run())
    out = tmp_path / "out"
    report.generate(path, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"report.html", "summary.json"}

    def no_space(src: str, dst: str):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_io.os, "replace", no_space)
    rr.write_jsonl(path, rr.build_run(seed=99))
    assert report.main([str(path), "--out", str(out)]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file left
    monkeypatch.undo()
    monkeypatch.setattr(report, "render_html", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        report.generate(path, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_follow_rewrites_the_report_while_the_run_goes_on(tmp_path, monkeypatch, capsys):
    records = rr.build_run()
    seg = rr.write_run(tmp_path / "run", []) / rr.SEGMENT
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the run writes 50 more steps meanwhile
        sleeps.append(seconds)
        rr.write_jsonl(seg, records[: 50 * len(sleeps)])

    monkeypatch.setattr(report.time, "sleep", sleep)
    args = [str(tmp_path / "run"), "--follow", "--interval", "5", "--max-refreshes", "4"]
    assert report.main(args) == 0 and sleeps == [5.0] * 3
    progress = [ln for ln in capsys.readouterr().out.splitlines() if "refresh" in ln]
    assert "refresh 1: nothing written yet (no metrics could be read)" in progress[0]
    assert "50 steps (last 49)" in progress[1] and "150 steps (last 149)" in progress[3]
    out = tmp_path / "run" / "report"
    assert json.loads((out / "summary.json").read_text())["steps"]["count"] == 150
    assert '<meta http-equiv="refresh" content="5">' in (out / "report.html").read_text()


def test_follow_says_when_the_input_is_gone(tmp_path, monkeypatch, capsys):
    path = rr.write_jsonl(tmp_path / "metrics.jsonl", rr.build_run()[:30])
    out = tmp_path / "out"
    monkeypatch.setattr(report.time, "sleep", lambda s: path.unlink(missing_ok=True))
    assert report.main([str(path), "--out", str(out), "--follow", "--max-refreshes", "2"]) == 0
    captured = capsys.readouterr()
    progress = [ln for ln in captured.out.splitlines() if "refresh" in ln]
    assert "refresh 1: 30 steps" in progress[0]
    assert progress[1].endswith(
        f"refresh 2: input {path} is gone; the last report at {out / 'report.html'} is kept"
    )
    assert captured.err.strip().splitlines() == [
        f"verl_gsm8k.report: error: input not found: {path}"]  # fmt: skip
    path.write_text("")  # a new input with no metrics yet: the old is kept
    assert report.main([str(path), "--out", str(out), "--follow", "--max-refreshes", "1"]) == 1
    line = [ln for ln in capsys.readouterr().out.splitlines() if "refresh 1" in ln][0]
    assert line.endswith(
        f"refresh 1: no metrics could be read; the last report at {out / 'report.html'} is kept"
    )


LONG, HACK_FROM = 60_000, 40_000  # length hacking planted: length +60%, score +0.15


def test_a_long_run_is_read_fast_and_drawn_bounded(tmp_path):
    rng, rows = random.Random(3), []
    for step in range(LONG):
        ramp = min(1.0, max(0.0, (step - HACK_FROM) / 100)) if step < HACK_FROM + 300 else 0.0
        score = 0.15 + 0.4 * (1 - math.exp(-step / 400)) + 0.15 * ramp + rng.uniform(-0.02, 0.02)
        rows.append({
            "critic/score/mean": round(score, 4),
            "actor/reward_kl_penalty": round(0.2 * (1 - math.exp(-step / 600)), 4),
            "actor/entropy": round(0.08 + 0.4 * math.exp(-step / 500) + rng.uniform(0, 0.004), 4),
            "actor/pg_clipfrac": round(0.004 * (1 + rng.uniform(-0.3, 0.3)), 5),
            "critic/vf_loss": round(0.05 + 0.15 * math.exp(-step / 20_000), 4),
            "response_length/mean": round(260 * (1 + 0.6 * ramp) * (1 + rng.uniform(-0.04, 0.04)),
                                          2),
            "timing_s/gen": 20.0, "timing_s/update_actor": 18.0, "timing_s/step": 40.0,
        })  # fmt: skip
        if step % 10 == 0:
            rows[-1][rr.VAL_KEY] = round(0.3 + 0.3 * (1 - math.exp(-step / 300)), 4)
    records = [{"step": s, "data": d} for s, d in enumerate(rows)]
    path, log = rr.write_jsonl(tmp_path / "run.jsonl", records), tmp_path / "console.log"
    log.write_text("".join(f"step:{s} - " + " - ".join(f"{k}:{v}" for k, v in d.items()) + "\n"
                           for s, d in enumerate(rows)))  # fmt: skip
    started = time.monotonic()
    summary = report.generate(path, tmp_path / "out").summary
    assert len(rp.load_run(log).steps) == LONG
    assert time.monotonic() - started < 60
    assert summary["steps"] == {"count": LONG, "first": 0, "last": LONG - 1, "gaps_before": []}
    assert summary["validation"]["points"] == LONG // 10
    warnings = [f for f in summary["health"] if f["severity"] != "note"]
    assert [f["check"] for f in warnings] == ["length_hacking"], warnings
    assert HACK_FROM - 20 <= warnings[0]["start_step"] <= HACK_FROM + 60
    assert HACK_FROM + 100 <= warnings[0]["end_step"] <= HACK_FROM + 300
    page = (tmp_path / "out" / "report.html").read_text()
    assert len(page) < 1_000_000
    svgs = rr.parse_svgs(page)
    assert (svgs["score"]["data-points"], svgs["val_acc"]["data-points"]) == (
        str(LONG), str(LONG // 10))  # fmt: skip
    for plot_id, svg in svgs.items():
        assert all(c == n and 0 < c <= svg_chart.MAX_DRAWN for c, n in svg["series"]), plot_id


@pytest.mark.parametrize("values", [(2.2e-308, 1.97e19), (1.93e294, 1.0)])
def test_a_log_axis_across_the_float_range_draws(values: tuple[float, float]):
    """A log axis padded past the floats' range: no 10**-324 (0) or 10**309 tick."""
    line = svg_chart.Line("vf_loss", [(0, values[0]), (1, values[1])], "#000")
    svg = svg_chart.render_line_plot(svg_chart.Plot("vf", "Value loss", [line]), (0, 1))
    assert rr.parse_svgs(svg)["vf"]["series"] == [(2, 2)] and svg.count('class="tick-y"') <= 24


def test_arbitrary_values_never_break_the_report(tmp_path):
    keys = ["critic/score/mean", "actor/reward_kl_penalty", "actor/entropy", "critic/vf_loss",
            "actor/pg_clipfrac", "response_length/mean", "timing_s/step", "timing_s/gen",
            "perf/throughput", "perf/total_num_tokens", rr.VAL_KEY]  # fmt: skip
    value = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                      st.integers(-(10**400), 10**400), st.none())  # fmt: skip
    record = st.tuples(st.integers(0, 60), st.dictionaries(st.sampled_from(keys), value))
    counter = iter(range(10**6))

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(st.lists(record, min_size=1, max_size=60))
    def check(rows: list[tuple[int, dict[str, Any]]]):
        out = tmp_path / f"case{next(counter)}"
        path = rr.write_jsonl(out / "m.jsonl", [{"step": s, "data": d} for s, d in rows])
        result = report.generate(path, out / "report")
        text = (out / "report" / "summary.json").read_text()
        json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
        assert result.summary["steps"]["count"] == len({step for step, _ in rows})
        rr.parse_svgs((out / "report" / "report.html").read_text())

    check()
