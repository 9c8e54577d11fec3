"""The report's trends: accuracy clearly below its best, a KL growing while the score does not."""

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from report_runs import LOG_256, LOG_512, STEPS, VAL_KEY, analyse_records, build_run, write_jsonl

from verl_gsm8k.analysis import checks as rl
from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.guard.thresholds import THRESHOLDS, Thresholds
from verl_gsm8k.report import cli as report
from verl_gsm8k.runpage import summary as rs

KL, SCORE = "actor/reward_kl_penalty", "critic/score/mean"
# A CPU PPO run from a 0.52 checkpoint: 20 steps, validated every 5, score ~0.19, KL 0 -> 0.17
CPU_VAL = {0: 0.52, 5: 0.33, 10: 0.19, 15: 0.25, 20: 0.29}


def cpu_ppo_run(run_dir: Path, problems: int | None = 100) -> Path:
    rng, records = random.Random(0), []
    for step in range(21):
        kl, score = 0.17 * step / 20 + rng.uniform(-0.005, 0.005), 0.19 + rng.uniform(-0.02, 0.02)
        data = {SCORE: score, "critic/rewards/mean": score - 0.001 * kl, KL: kl} if step else {}
        records.append({"step": step, "data": data | ({VAL_KEY: CPU_VAL[step]}
                                                      if step in CPU_VAL else {})})  # fmt: skip
    write_jsonl(run_dir / "metrics" / "metrics-20261122T000000Z.jsonl", records)
    for step, acc in CPU_VAL.items() if problems else ():
        rows = [{"input": f"problem {i}", "output": "#### 1",
                 "score": float(i < round(acc * problems))} for i in range(problems)]  # fmt: skip
        write_jsonl(run_dir / "validation" / f"{step}.jsonl", rows)
    return run_dir


@pytest.mark.parametrize("problems", [100, None])
def test_cpu_ppo_run_now_warns_twice(tmp_path, problems: int | None, capsys):
    """Both named in the terminal, summary.json and the page, with or without the dumps."""
    run = cpu_ppo_run(tmp_path / "run", problems)
    assert report.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "health              : 0 errors, 2 warnings, 0 notes" in out
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert summary["validation"]["problems"] == problems
    acc, kl = sorted(summary["health"], key=lambda f: f["check"])
    assert (acc["check"], acc["start_step"], acc["end_step"]) == ("accuracy_below_best", 0, 20)
    ev = acc["evidence"]
    assert (ev["best_step"], ev["best"], ev["last_step"], ev["last"]) == (0, 0.52, 20, 0.29)
    assert ev["evaluations_below"] == 4 and ev["below_since_step"] == 5
    if problems:  # 2.5 standard errors of a difference of two evaluations, p = 0.405
        assert ev["bar"] == pytest.approx(2.5 * math.sqrt(2 * 0.405 * 0.595 / 100))
        assert "on 100 problems" in acc["message"]
        assert f"val problems        : 100 ({run / 'validation' / '20.jsonl'})" in out
    else:
        assert ev["bar"] == pytest.approx(0.10) and "val problems" not in out
        assert "number of problems not known" in acc["message"]
    assert "ended at 0.29 (step 20), 0.23 below its best 0.52 (step 0, before training)" in (
        acc["message"])  # fmt: skip
    assert "[warning] accuracy_below_best steps 0-20: validation accuracy ended at 0.29" in out
    assert (kl["check"], kl["metric"], kl["start_step"], kl["end_step"]) == (
        "kl_without_score_gain", "kl", 11, 20)  # fmt: skip
    assert "actor/reward_kl_penalty" in kl["message"] and "critic/score/mean" in kl["message"]
    assert kl["evidence"]["kl_end"] > 1.5 * kl["evidence"]["kl_start"]
    page = (run / "report" / "report.html").read_text()
    for name in ("accuracy_below_best", "kl_without_score_gain"):
        assert f"<td>{name}</td>" in page, name
    for name in ("acc_drop_abs", "acc_drop_z", "kl_gain_ratio", "kl_gain_score_min"):
        assert f"<code>{name}</code>" in page, name  # the thresholds table
    for plot_id in ("val_acc", "kl", "score"):  # shaded: validation accuracy; KL and score
        svg = page[page.index(f'id="plot-{plot_id}"') :]
        assert svg[: svg.index("</svg>")].count('class="band"') == 1, plot_id


def below_best(val: list[tuple[int, float]], problems: int | None = None,
               t: Thresholds = THRESHOLDS) -> list[Any]:  # fmt: skip
    data = rp.RunData(val_problems=problems)
    for step, value in val:
        data.merge(step, {VAL_KEY: value})
    return rl.check_accuracy_below_best(rp.canonicalize(data), t)


@pytest.mark.parametrize("problems", [None, 100, 1319])
def test_accuracy_that_peaked_and_fell_warns(problems: int | None):
    gradual = [(0, 0.40), (5, 0.84), (10, 0.80), (15, 0.76), (20, 0.72), (25, 0.66)]
    for val in ([(0, 0.40), (5, 0.84), (25, 0.66)], gradual):
        (hit,) = below_best(val, problems)
        assert (hit.check, hit.severity, hit.metric, hit.start_step, hit.end_step) == (
            "accuracy_below_best", "warning", "val_acc", 5, 25)  # fmt: skip
        assert "ended at 0.66 (step 25), 0.18 below its best 0.84 (step 5)" in hit.message
        assert "keep its checkpoint" in hit.message and "docs/reading-a-ppo-run.md" in hit.message


def test_a_dip_noise_or_a_best_at_the_end_is_silent():
    rising = [(s, 0.30 + 0.004 * s) for s in range(0, 101, 10)]  # 0.30 -> 0.70
    for dip_at in (30, 60, 90):  # one evaluation 0.25 down, then back on the curve
        assert below_best([(s, v - 0.25 * (s == dip_at)) for s, v in rising]) == [], dip_at
    (hit,) = below_best([(s, v - 0.25 * (s == 100)) for s, v in rising])
    assert hit.evidence["best_step"] == 90 and hit.evidence["evaluations_below"] == 1
    for seed in range(20):  # rising with noise of +-0.03
        rng = random.Random(seed)
        val = [(s, 0.30 + 0.25 * (1 - math.exp(-s / 60)) + rng.uniform(-0.03, 0.03))
               for s in range(0, 301, 10)]  # fmt: skip
        assert below_best(val) == below_best(val, problems=1319) == [], seed
    for val in ([(0, 0.3)], [(0, 0.3), (10, 0.2), (20, 0.5)], []):
        assert below_best(val) == []


def test_drop_bar_relative_floor_and_noise():
    t, bar = THRESHOLDS, rl.accuracy_drop_bar
    assert bar(0.84, 0.66, None, t)[0] == pytest.approx(0.10)
    assert bar(0.20, 0.10, None, t)[0] == pytest.approx(0.05)  # 25% of best
    assert bar(0.08, 0.0, None, t)[0] == pytest.approx(0.03)  # the floor
    assert bar(0.5, 0.4, 1319, t)[0] == pytest.approx(0.10)
    assert bar(0.5, 0.3, 24, t)[0] == pytest.approx(2.5 * math.sqrt(2 * 0.4 * 0.6 / 24))
    assert below_best([(0, 0.5), (10, 0.4)])  # exactly the bar (0.0999... in floating point)
    assert below_best([(0, 0.05), (10, 0.20), (20, 0.14)])
    assert below_best([(0, 0.05), (10, 0.20), (20, 0.16)]) == []
    assert below_best([(0, 0.042), (2, 0.0)], problems=24) == []
    strict = Thresholds(acc_drop_abs=0.02, acc_drop_rel=0.02, acc_drop_floor=0.0)
    assert below_best([(0, 0.5), (10, 0.48)], t=strict)


def planted(score: Any, kl: Any, kl_key: str = KL, score_range=None) -> list[dict[str, Any]]:
    rng = random.Random(5)

    def mutate(step: int, d: dict[str, Any]):
        d[SCORE] = score(step) + rng.uniform(-0.02, 0.02)
        d["critic/rewards/mean"] = d[SCORE] - 0.01
        d.pop(KL)
        d[kl_key] = kl(step) + rng.uniform(0, 0.005)
        if score_range:
            d["critic/score/min"], d["critic/score/max"] = score_range

    return build_run(mutate)


def kl_findings(records: list[dict[str, Any]]) -> list[Any]:
    data = rp.RunData()
    for record in records:
        data.merge(record["step"], record["data"])
    return rl.check_kl_without_score_gain(rp.canonicalize(data), THRESHOLDS)


def test_kl_growing_while_the_score_is_flat_warns(tmp_path):
    findings = analyse_records(tmp_path, planted(lambda s: 0.40, lambda s: 0.3 * s / STEPS))[2]
    (hit,) = findings  # nothing else fires
    assert (hit.check, hit.metric, hit.start_step, hit.end_step) == (
        "kl_without_score_gain", "kl", STEPS // 2 + 1, STEPS)  # fmt: skip
    ev = hit.evidence
    assert ev["window_steps"] == STEPS // 2 and ev["score_metric"] == "score"
    assert abs(ev["score_end"] - ev["score_start"]) < 0.02
    assert ev["kl_start"] < ev["kl_middle"] < ev["kl_end"] and ev["kl_end"] > 1.5 * ev["kl_start"]
    assert f"over steps {STEPS // 2 + 1}-{STEPS} (the last {STEPS // 2} steps)" in hit.message
    assert kl_findings(planted(lambda s: 0.2 + 0.5 * s / STEPS, lambda s: 0.3 * s / STEPS)) == []
    assert kl_findings(planted(lambda s: 0.40, lambda s: 0.15)) == []
    assert kl_findings(planted(lambda s: 0.40, lambda s: 0.3 * s / STEPS)[:20]) == []
    (hit,) = kl_findings(planted(lambda s: 0.40, lambda s: 0.3 * s / STEPS)[:21])
    assert (hit.start_step, hit.end_step) == (11, 20)


def test_grpo_kl_loss_and_reward_without_score():
    """Without critic/score/mean the reward is judged."""
    records = planted(lambda s: 0.40, lambda s: 0.2 * s / STEPS, kl_key="actor/kl_loss")
    for record in records:
        record["data"].pop(SCORE, None)
    (hit,) = kl_findings(records)
    assert hit.metric == "kl_loss" and hit.evidence["score_metric"] == "reward"
    assert "actor/kl_loss" in hit.message and "critic/rewards/mean" in hit.message


@pytest.mark.parametrize(("score", "low", "high", "severity"), [
    (0.92, 0, 1, "note"),  # converged: the sampled score near the top of a 0/1 reward
    (0.92, None, None, "warning"),  # the same without critic/score/min and /max
    (0.78, 0, 1, "warning"),  # 0.22 below the top: still room to gain
    (0.82, 0, 1, "note"),
    (2.3, -1, 3, "note"),  # another reward's scale: 0.7 below the top of a range of 4
    (2.1, -1, 3, "warning"),
])  # fmt: skip
def test_converged_means_within_headroom_of_the_range(score, low, high, severity):
    bounds = (low, high) if high is not None else None
    (hit,) = kl_findings(planted(lambda s: score, lambda s: 0.2 * s / STEPS, score_range=bounds))
    assert hit.severity == severity
    if severity == "note":
        assert hit.evidence["converged"] and "the run has converged" in hit.message
        assert (hit.evidence["score_floor"], hit.evidence["score_ceiling"]) == (low, high)
        assert f"range {low}..{high}" in hit.message


@pytest.mark.parametrize("log", [LOG_512, LOG_256])
def test_real_logs_silent_at_every_step(verl_logs_dir, log: str):
    canon = rs.analyse(verl_logs_dir / log)[1]  # the whole log: test_health's no false alarm
    for last in range(10, max(canon.all_steps) + 1):
        series = {k: [(s, v) for s, v in p if s <= last] for k, p in canon.series.items()}
        prefix = replace(canon, series=series)
        assert rl.check_accuracy_below_best(prefix, THRESHOLDS) == [], last
        assert rl.check_kl_without_score_gain(prefix, THRESHOLDS) == [], last
