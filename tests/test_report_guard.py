"""The report of a guarded run: a reward turned NaN, the watchdog's trips, the kept best."""

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from browser import dom as chromium_dom
from report_runs import STAMP, VAL_KEY, parse_svgs, plant_nan
from test_replay import write_run

from verl_gsm8k.common.run_dir import append_trip, write_best
from verl_gsm8k.report import cli as report

SICK_FROM = 4


def strict_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path}: {c}"))


def sick_run(root: Path) -> Path:
    """A 6-step run validated at steps 0 and 6, its reward NaN from step SICK_FROM."""
    run = write_run(root, steps=6)
    segment = next((run / "metrics").glob("*.jsonl"))
    records = [json.loads(line) for line in segment.read_text().splitlines()]
    records[-1]["data"][VAL_KEY] = 0.5  # verl validates at the last step (validation/6.jsonl)
    segment.write_text("".join(json.dumps(r) + "\n" for r in records))
    plant_nan(run, SICK_FROM)
    return run


def test_a_run_whose_reward_turned_nan_is_reported_with_where_it_turned(tmp_path, capsys):
    run = sick_run(tmp_path)
    assert "NaN" in (run / "rollouts" / f"{SICK_FROM}.jsonl").read_text()  # as verl dumps it
    out = tmp_path / "out"
    assert report.main([str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err

    summary = strict_json(out / "summary.json")
    (turned,) = [f for f in summary["health"] if f["check"] == "non_finite"]  # the watchdog's rule
    assert (turned["severity"], turned["start_step"], turned["end_step"]) == ("error", SICK_FROM, 6)
    evidence = turned["evidence"]
    assert (evidence["key"], evidence["step_before"]) == ("critic/score/mean", SICK_FROM - 1)
    assert "also: actor/pg_loss, critic/vf_loss" in evidence["threshold"]
    assert summary["validation"]["not_finite_steps"] == [6]
    assert f"non_finite at step {SICK_FROM} and the 2 trained steps to 6" in printed.out
    assert "final val accuracy  : NaN at step 6 (last finite: 0.3 at step 0)" in printed.out

    page = (out / "report.html").read_text()
    banner = re.search(r'<p id="turned" class="sev-error">([^<]*)</p>', page)
    assert banner and f"non_finite at step {SICK_FROM}" in banner.group(1)
    assert "NaN @ step 6" in page
    index = (out / "replay" / "index.js").read_text()
    means = dict(re.findall(r'\{"step":(\d+),"n":\d+,"mean":([^}]*)\}', index))
    assert means[str(SICK_FROM)] == "null" and means[str(SICK_FROM - 1)] == "0.75"
    for data in [*(out / "replay").glob("*.js"), *(out / "rollouts").glob("*.js")]:
        assert "NaN" not in data.read_text(), data
    questions = strict_json(out / "questions" / "summary.json")
    assert questions["columns"] == ["0"]
    (line,) = [x for x in printed.err.splitlines() if "questions page" in x]
    assert "validation dumps 6 left out" in line and "validation/6.jsonl: row 1" in line

    dom = chromium_dom(f"{(out / 'rollouts.html').as_uri()}#kind=train&step={SICK_FROM}", tmp_path)
    assert dom.count("score NaN") == 4  # the response's score as the reward gave it, not "n/a"


def test_watchdog_trips_and_the_kept_best_checkpoint_are_shown(tmp_path, capsys):
    """Also, from a shared folder: a terminal escape printed escaped, a line nested 100k deep."""
    run = write_run(tmp_path, steps=6)
    keys = ("step", "rule", "metric", "value", "threshold", "action", "last_healthy_checkpoint",
            "message")  # fmt: skip
    for row in [(3, "entropy_collapse", "actor/entropy", 0.001, 0.01, "warn", 2, "w"),
                          (5, "non_finite", "actor/pg_loss", math.nan, "finite", "stop", 4, "s"),
                          (6, "non_finite", "actor/pg_loss\x1b]0;owned\x07", 1.0, "finite",
                           "warn", 4, "s\x1b[2J")]:  # fmt: skip
        append_trip(run, {"launch": STAMP, **dict(zip(keys, row, strict=True))})
    segment = next((run / "metrics").glob("*.jsonl"))
    lines = segment.read_text().splitlines()
    steps = {json.loads(line)["step"] for line in lines}
    segment.write_text("\n".join([*lines[:2], "[" * 100_000 + "]" * 100_000, *lines[2:]]) + "\n")
    with (run / "watchdog.jsonl").open("a") as handle:
        handle.write('{"step": 6, "rule": "cut by a ki')  # a kill mid-append: skipped
    write_best(run, 4, VAL_KEY, 0.57, STAMP)
    out = tmp_path / "out"
    assert report.main([str(run), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "\x1b" not in printed + captured.err
    assert "non_finite on actor/pg_loss\\x1b]0;owned\\x07" in printed
    (warning,) = [x for x in captured.err.splitlines() if "nested too deep" in x]
    assert f"{segment}:3: invalid JSON (nested too deep), skipped" in warning

    summary = strict_json(out / "summary.json")
    assert summary["steps"]["count"] == len(steps)
    trips = summary["watchdog_trips"]
    assert [(t["step"], t["action"], t["value_text"]) for t in trips] == [
        (3, "warn", "0.001"), (5, "stop", "NaN"), (6, "warn", "1")]  # fmt: skip
    assert trips[1]["value"] is None  # strict JSON; value_text keeps the NaN
    assert summary["best_checkpoint"] == {"format": 1, "step": 4, "metric": VAL_KEY,
                                          "value": 0.57, "launch": STAMP}  # fmt: skip
    found = {(f["check"], f["severity"], f["start_step"]) for f in summary["health"]}
    assert {("watchdog", "warning", 3), ("watchdog", "error", 5)} <= found

    page = (out / "report.html").read_text()
    table = page.split('<table id="watchdog-trips">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<tr class="trip">(.*?)</tr>', table)
    cells = [re.findall(r"<td>([^<]*)</td>", row) for row in rows]
    assert cells[1] == ["5", "non_finite", "actor/pg_loss", "NaN", "finite", "stop",
                        "global_step_4", STAMP]  # fmt: skip
    assert cells[0][:7] == ["3", "entropy_collapse", "actor/entropy", "0.001", "0.01", "warn",
                            "global_step_2"]  # fmt: skip
    best = re.search(r'<p id="best-checkpoint">(.*?)</p>', page)
    assert best and f"step 4 ({VAL_KEY} = 0.57)" in best.group(1) and "--best" in best.group(1)
    bands = re.findall(r'<rect class="band"[^>]*><title>(\w+): steps (\d+)-(\d+)</title>', page)
    assert ("error", "5", "5") in bands and ("warning", "3", "3") in bands
    parse_svgs(page)
    assert "watchdog trip       : step 5: non_finite on actor/pg_loss = NaN" in printed
    assert "global_step_4" in printed and f"kept best checkpoint: step 4 ({VAL_KEY}" in printed


@pytest.mark.parametrize(
    ("text", "why"),
    [("{not json", "not readable JSON"), ('{"step": "4", "value": 0.5}', "no integer 'step'")],
)
def test_an_unreadable_best_checkpoint_file_is_one_line(tmp_path, capsys, text, why):
    run = write_run(tmp_path, steps=4)
    (run / "best_checkpoint.json").write_text(text)
    assert report.main([str(run), "--out", str(tmp_path / "out")]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "best_checkpoint.json" in x]
    assert len(lines) == 1 and why in lines[0] and "Traceback" not in lines[0], lines
    assert lines[0].startswith(f"verl_gsm8k.report: warning: {run / 'best_checkpoint.json'}: ")
    summary = strict_json(tmp_path / "out" / "summary.json")
    assert summary["best_checkpoint"] is None and why in summary["best_checkpoint_problem"]
    page = (tmp_path / "out" / "report.html").read_text()
    assert 'id="best-checkpoint" class="sev-warning"' in page
