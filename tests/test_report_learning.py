"""The report's learning trends (verl_gsm8k/analysis/checks.py): validation accuracy that fell
clearly below its best, and a KL that keeps growing while the train score does not.

Planted runs go through the whole report (parse, canonical names, checks, summary.json, HTML,
terminal); the two real verl logs must stay silent, at every step a --follow would show.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from browser import plot_series, render, require_chromium
from report_runs import (
    LOG_256,
    LOG_512,
    STEPS,
    VAL_KEY,
    analyse_records,
    build_run,
    checks_fired,
    only,
    write_jsonl,
)

from verl_gsm8k.analysis import checks as rl
from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.guard.thresholds import THRESHOLDS, Thresholds
from verl_gsm8k.report import cli as report
from verl_gsm8k.runpage import summary as rs

# --------------------------------------------------------------------------------------------
# The CPU experiment (shared/notes/learning-on-cpu.md): PPO from a 0.52 checkpoint, 20 steps,
# greedy validation every 5 steps on 100 problems, train score flat ~0.19, KL penalty 0 -> 0.17.
# Its report printed "0 warnings".
# --------------------------------------------------------------------------------------------

CPU_VAL = {0: 0.52, 5: 0.33, 10: 0.19, 15: 0.25, 20: 0.29}


def cpu_ppo_run(run_dir: Path, problems: int | None = 100, seed: int = 0) -> Path:
    """The CPU PPO run as a run directory: metrics segment, and validation dumps if problems."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for step in range(21):
        data: dict[str, Any] = {}
        if step > 0:
            kl = 0.17 * step / 20 + rng.uniform(-0.005, 0.005)
            score = 0.19 + rng.uniform(-0.02, 0.02)
            data.update(
                {
                    "critic/score/mean": score,
                    "critic/rewards/mean": score - 0.001 * kl,
                    "actor/reward_kl_penalty": kl,
                    "actor/reward_kl_penalty_coeff": 0.001,
                }
            )
        if step in CPU_VAL:
            data[VAL_KEY] = CPU_VAL[step]
        records.append({"step": step, "data": data})
    write_jsonl(run_dir / "metrics" / "metrics-20261122T000000Z.jsonl", records)
    if problems:
        for step, acc in CPU_VAL.items():
            right = round(acc * problems)
            write_jsonl(
                run_dir / "validation" / f"{step}.jsonl",
                [
                    {"input": f"problem {i}", "output": "#### 1", "score": float(i < right)}
                    for i in range(problems)
                ],
            )
    return run_dir


@pytest.mark.parametrize("problems", [100, None])
def test_cpu_ppo_run_now_warns_twice(
    tmp_path: Path, problems: int | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both failures of that run are named, in the terminal, summary.json and the HTML page,
    with or without the validation dumps that tell the number of problems."""
    run = cpu_ppo_run(tmp_path / "run", problems)
    assert report.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "health              : 0 errors, 2 warnings, 0 notes" in out
    summary = json.loads((run / "report" / "summary.json").read_text(encoding="utf-8"))
    assert summary["validation"]["problems"] == problems
    assert {f["check"] for f in summary["health"]} == {
        "accuracy_below_best",
        "kl_without_score_gain",
    }
    acc = next(f for f in summary["health"] if f["check"] == "accuracy_below_best")
    assert (acc["start_step"], acc["end_step"]) == (0, 20)
    ev = acc["evidence"]
    assert (ev["best_step"], ev["best"], ev["last_step"], ev["last"]) == (0, 0.52, 20, 0.29)
    assert ev["evaluations_below"] == 4 and ev["below_since_step"] == 5
    if problems:
        # 2.5 standard errors of a difference of two evaluations on 100 problems, p = 0.405
        assert ev["bar"] == pytest.approx(2.5 * math.sqrt(2 * 0.405 * 0.595 / 100))
        assert "on 100 problems" in acc["message"]
        assert f"val problems        : 100 ({run / 'validation' / '20.jsonl'})" in out
    else:
        assert ev["bar"] == pytest.approx(0.10)
        assert "number of problems not known" in acc["message"]
        assert "val problems" not in out
    assert (
        "ended at 0.29 (step 20), 0.23 below its best 0.52 (step 0, before training)"
        in (acc["message"])
    )
    assert "[warning] accuracy_below_best steps 0-20: validation accuracy ended at 0.29" in out
    kl = next(f for f in summary["health"] if f["check"] == "kl_without_score_gain")
    assert (kl["metric"], kl["start_step"], kl["end_step"]) == ("kl", 11, 20)
    assert "actor/reward_kl_penalty" in kl["message"] and "critic/score/mean" in kl["message"]
    assert kl["evidence"]["kl_end"] > 1.5 * kl["evidence"]["kl_start"]
    page = (run / "report" / "report.html").read_text(encoding="utf-8")
    for check in ("accuracy_below_best", "kl_without_score_gain"):
        assert f"<td>{check}</td>" in page, check
    for name in ("acc_drop_abs", "acc_drop_z", "kl_gain_ratio", "kl_gain_score_min"):
        assert f"<code>{name}</code>" in page, name  # the Thresholds table
    # shaded on the plots: validation accuracy; KL and train score
    for plot_id, count in (("val_acc", 1), ("kl", 1), ("score", 1)):
        svg = page[page.index(f'id="plot-{plot_id}"') :]
        svg = svg[: svg.index("</svg>")]
        assert svg.count('class="band"') == count, plot_id


def test_cpu_ppo_run_page_in_a_real_browser(tmp_path: Path) -> None:
    """Both warnings in the health table as Chromium lays the page out, and the curves they
    speak of: validation accuracy falling from 0.52 to 0.29, the KL climbing past 0.15."""
    require_chromium()
    run = cpu_ppo_run(tmp_path / "run")
    report.generate(run, run / "report")
    dom, png = render(run / "report" / "report.html", tmp_path)
    assert png.stat().st_size > 20_000
    for check in ("accuracy_below_best", "kl_without_score_gain"):
        assert f"<td>{check}</td>" in dom, check
    val = plot_series(dom, "Validation accuracy")["val_acc"]
    assert [round(x) for x, _ in val] == list(CPU_VAL)
    assert [y for _, y in val] == pytest.approx(list(CPU_VAL.values()), abs=0.002)
    kl = plot_series(dom, "KL to the reference policy")["kl"]
    assert kl[0][1] < 0.02 and kl[-1][1] > 0.15


# --------------------------------------------------------------------------------------------
# accuracy_below_best
# --------------------------------------------------------------------------------------------


def canon_with_val(val: list[tuple[int, float]], problems: int | None = None) -> rp.Canonical:
    data = rp.RunData(val_problems=problems)
    for step, value in val:
        data.merge(step, {VAL_KEY: value})
    return rp.canonicalize(data)


def below_best(val: list[tuple[int, float]], problems: int | None = None) -> list[Any]:
    return rl.check_accuracy_below_best(canon_with_val(val, problems), THRESHOLDS)


@pytest.mark.parametrize("problems", [None, 100, 1319])
@pytest.mark.parametrize(
    "val",
    [
        [(0, 0.40), (5, 0.84), (25, 0.66)],
        [(0, 0.40), (5, 0.84), (10, 0.80), (15, 0.76), (20, 0.72), (25, 0.66)],
    ],
    ids=["three-evaluations", "gradual-fall"],
)
def test_accuracy_that_peaked_and_fell_warns(
    val: list[tuple[int, float]], problems: int | None
) -> None:
    (hit,) = below_best(val, problems)
    assert (hit.check, hit.severity, hit.metric) == ("accuracy_below_best", "warning", "val_acc")
    assert (hit.start_step, hit.end_step) == (5, 25)
    assert "ended at 0.66 (step 25), 0.18 below its best 0.84 (step 5)" in hit.message
    assert "keep its checkpoint" in hit.message and "docs/reading-a-ppo-run.md" in hit.message


def test_accuracy_single_dip_then_recovery_is_silent() -> None:
    rising = [(s, 0.30 + 0.004 * s) for s in range(0, 101, 10)]  # 0.30 -> 0.70
    for dip_at in (30, 60, 90):  # one evaluation 0.25 down, then back on the curve
        dipped = [(s, v - 0.25 if s == dip_at else v) for s, v in rising]
        assert below_best(dipped) == [], dip_at
    # ... unless the dip is the last evaluation: then the run ends there
    (hit,) = below_best([(s, v - 0.25 if s == 100 else v) for s, v in rising])
    assert hit.evidence["best_step"] == 90 and hit.evidence["evaluations_below"] == 1


def test_noisy_rising_accuracy_is_silent() -> None:
    """Rising with noise of +-0.03 (twice GSM8K's standard error on 1319 problems)."""
    for seed in range(20):
        rng = random.Random(seed)
        val = [(s, 0.30 + 0.25 * (1 - math.exp(-s / 60)) + rng.uniform(-0.03, 0.03))
               for s in range(0, 301, 10)]  # fmt: skip
        assert below_best(val) == below_best(val, problems=1319) == [], seed


def test_drop_bar_relative_floor_and_noise() -> None:
    t = THRESHOLDS
    assert rl.accuracy_drop_bar(0.84, 0.66, None, t)[0] == pytest.approx(0.10)
    assert rl.accuracy_drop_bar(0.20, 0.10, None, t)[0] == pytest.approx(0.05)  # 25% of best
    assert rl.accuracy_drop_bar(0.08, 0.0, None, t)[0] == pytest.approx(0.03)  # the floor
    # a large validation set adds nothing; a small one raises the bar to 2.5 SE
    assert rl.accuracy_drop_bar(0.5, 0.4, 1319, t)[0] == pytest.approx(0.10)
    assert rl.accuracy_drop_bar(0.5, 0.3, 24, t)[0] == pytest.approx(
        2.5 * math.sqrt(2 * 0.4 * 0.6 / 24)
    )
    # exactly the bar is clearly below (0.5 - 0.4 is 0.0999... in floating point)
    assert below_best([(0, 0.5), (10, 0.4)])
    # a low-accuracy run losing a third of what it learnt, and one within its bar
    assert below_best([(0, 0.05), (10, 0.20), (20, 0.14)])
    assert below_best([(0, 0.05), (10, 0.20), (20, 0.16)]) == []
    # near 0, noise: the tiny random model of the smoke runs on 24 problems
    assert below_best([(0, 0.042), (2, 0.0)], problems=24) == []
    # tunable
    strict = Thresholds(acc_drop_abs=0.02, acc_drop_rel=0.02, acc_drop_floor=0.0)
    assert rl.check_accuracy_below_best(canon_with_val([(0, 0.5), (10, 0.48)]), strict)


def test_best_at_the_end_or_one_evaluation_is_silent() -> None:
    assert below_best([(0, 0.3)]) == []
    assert below_best([(0, 0.3), (10, 0.2), (20, 0.5)]) == []
    assert below_best([]) == []


# --------------------------------------------------------------------------------------------
# kl_without_score_gain
# --------------------------------------------------------------------------------------------

KL = "actor/reward_kl_penalty"
SCORE = "critic/score/mean"


def planted(score: Any, kl: Any, kl_key: str = KL) -> list[dict[str, Any]]:
    """build_run with the train score and the KL replaced by functions of the step."""
    rng = random.Random(5)

    def mutate(step: int, d: dict[str, Any]) -> None:
        if score is not None:
            d[SCORE] = score(step) + rng.uniform(-0.02, 0.02)
            d["critic/rewards/mean"] = d[SCORE] - 0.01
        d.pop(KL)
        d[kl_key] = kl(step) + rng.uniform(0, 0.005)

    return build_run(mutate)


def test_rising_score_and_rising_kl_is_silent(tmp_path: Path) -> None:
    records = planted(lambda s: 0.2 + 0.5 * s / STEPS, lambda s: 0.3 * s / STEPS)
    assert analyse_records(tmp_path, records)[2] == []


def test_flat_score_and_rising_kl_warns(tmp_path: Path) -> None:
    records = planted(lambda s: 0.40, lambda s: 0.3 * s / STEPS)
    findings = analyse_records(tmp_path, records)[2]
    assert checks_fired(findings) == {"kl_without_score_gain"}
    hit = only(findings, "kl_without_score_gain")
    assert (hit.metric, hit.start_step, hit.end_step) == ("kl", STEPS // 2 + 1, STEPS)
    ev = hit.evidence
    assert ev["window_steps"] == STEPS // 2 and ev["score_metric"] == "score"
    assert abs(ev["score_end"] - ev["score_start"]) < 0.02
    assert ev["kl_start"] < ev["kl_middle"] < ev["kl_end"] and ev["kl_end"] > 1.5 * ev["kl_start"]
    assert f"over steps {STEPS // 2 + 1}-{STEPS} (the last {STEPS // 2} steps)" in hit.message


def test_flat_score_and_flat_kl_is_silent(tmp_path: Path) -> None:
    records = planted(lambda s: 0.40, lambda s: 0.15)
    assert analyse_records(tmp_path, records)[2] == []


def test_grpo_kl_loss_and_reward_without_score(tmp_path: Path) -> None:
    """GRPO logs the KL as actor/kl_loss; a run without critic/score/mean is judged on
    critic/rewards/mean."""
    records = planted(lambda s: 0.40, lambda s: 0.2 * s / STEPS, kl_key="actor/kl_loss")
    for record in records:
        record["data"].pop(SCORE, None)
    hit = only(analyse_records(tmp_path, records)[2], "kl_without_score_gain")
    assert hit.metric == "kl_loss" and hit.evidence["score_metric"] == "reward"
    assert "actor/kl_loss" in hit.message and "critic/rewards/mean" in hit.message


def with_score_range(
    records: list[dict[str, Any]], low: float, high: float
) -> list[dict[str, Any]]:
    """The records with the worst and best response's score logged, as verl does each step."""
    for record in records:
        if SCORE in record["data"]:
            record["data"].update({"critic/score/min": low, "critic/score/max": high})
    return records


def test_flat_score_near_its_ceiling_is_a_note_not_a_warning(tmp_path: Path) -> None:
    """A converged run (sampled score ~0.92 of a 0/1 reward) whose KL keeps creeping up: the
    check names it, as a note saying to stop earlier, and raises no warning."""
    records = with_score_range(planted(lambda s: 0.92, lambda s: 0.2 * s / STEPS), 0, 1)
    (hit,) = analyse_records(tmp_path, records)[2]
    assert (hit.check, hit.severity) == ("kl_without_score_gain", "note")
    ev = hit.evidence
    assert ev["converged"] and (ev["score_floor"], ev["score_ceiling"]) == (0, 1)
    assert "the run has converged" in hit.message and "range 0..1" in hit.message
    # the same numbers without critic/score/min and /max: the range is not known, a warning
    plain = planted(lambda s: 0.92, lambda s: 0.2 * s / STEPS)
    assert only(analyse_records(tmp_path / "b", plain)[2], "kl_without_score_gain").severity == (
        "warning"
    )


@pytest.mark.parametrize(
    ("score", "low", "high", "severity"),
    [
        (0.78, 0, 1, "warning"),  # 0.22 below the top: still room to gain
        (0.82, 0, 1, "note"),
        (0.40, 0, 1, "warning"),  # the CPU spike's kind of run
        (2.3, -1, 3, "note"),  # another reward's scale: 0.7 below the top of a range of 4
        (2.1, -1, 3, "warning"),
    ],
)
def test_converged_means_within_headroom_of_the_range(
    tmp_path: Path, score: float, low: float, high: float, severity: str
) -> None:
    records = with_score_range(planted(lambda s: score, lambda s: 0.2 * s / STEPS), low, high)
    hit = only(analyse_records(tmp_path, records)[2], "kl_without_score_gain")
    assert hit.severity == severity


def test_kl_check_needs_ten_steps_in_its_window(tmp_path: Path) -> None:
    records = planted(lambda s: 0.40, lambda s: 0.3 * s / STEPS)[:20]  # steps 1-19: window 9
    assert "kl_without_score_gain" not in checks_fired(analyse_records(tmp_path, records)[2])
    records = planted(lambda s: 0.40, lambda s: 0.3 * s / STEPS)[:21]  # steps 1-20: window 10
    hit = only(analyse_records(tmp_path / "b", records)[2], "kl_without_score_gain")
    assert (hit.start_step, hit.end_step) == (11, 20)


# --------------------------------------------------------------------------------------------
# The real logs: silent on the whole run and at every step a --follow would have shown
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("log", [LOG_512, LOG_256])
def test_real_logs_silent_at_every_step(verl_logs_dir: Path, log: str) -> None:
    _, canon, findings, _ = rs.analyse(verl_logs_dir / log)
    assert not {"accuracy_below_best", "kl_without_score_gain"} & {f.check for f in findings}
    for last in range(10, max(canon.all_steps) + 1):
        prefix = replace(
            canon,
            series={k: [(s, v) for s, v in p if s <= last] for k, p in canon.series.items()},
        )
        assert rl.check_accuracy_below_best(prefix, THRESHOLDS) == [], last
        assert rl.check_kl_without_score_gain(prefix, THRESHOLDS) == [], last
