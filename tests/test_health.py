"""The report's health checks: the watchdog's rules over every step, the whole-run trends."""

import math
import random
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from helpers import ROOT
from report_runs import STEPS, VAL_KEY, analyse_records, build_run, checks_fired, only, write_jsonl

from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.analysis.checks import check_dropped_groups, dropped_groups, health_checks
from verl_gsm8k.guard.rules import judge_run
from verl_gsm8k.guard.thresholds import THRESHOLDS, doc_table
from verl_gsm8k.runpage import summary as rs

KL = "actor/reward_kl_penalty"


def _from(first: int, **values: Any):
    def mutate(step: int, d: dict[str, Any]):
        if step >= first:
            d.update({k: v(step - first) if callable(v) else v for k, v in values.items()})

    return mutate


# Each pathology planted in the healthy run, and what else the report says of it.
# fmt: off
PLANTED = {
    # KL growing 6 % a step while the score has plateaued: the ceiling, and the trend
    "kl_ceiling": (_from(120, **{KL: lambda k: 0.2 * 1.06**k}), {"kl_without_score_gain"}),
    "kl_spike": (lambda s, d: d.update({KL: 2.5}) if s in (150, 151) else None, set()),
    "entropy_collapse": (_from(100, **{"actor/entropy": lambda k: 0.15 * math.exp(-k / 8)}),
                         set()),
    "critic_divergence": (_from(120, **{"critic/vf_loss": lambda k: 0.08 * 1.1**k}),
                          {"value_loss_not_decreasing"}),
    "clipped_update": (lambda s, d: d.update({"actor/pg_clipfrac": 0.7}) if 50 <= s < 110
                       else None, set()),
    "length_collapse": (_from(150, **{"response_length/mean": 30.0}), set()),
}
# fmt: on


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_a_planted_pathology_is_flagged_on_the_steps_the_watchdog_trips(tmp_path, rule):
    mutate, more = PLANTED[rule]
    data, _, findings, _ = analyse_records(tmp_path, build_run(mutate))
    tripped = [step for step, trip in judge_run(data.steps, THRESHOLDS) if trip.rule == rule]
    hits = [f for f in findings if f.check == rule]
    flagged = [s for f in hits for s in data.steps if f.start_step <= s <= f.end_step]
    assert tripped and flagged == tripped, [str(f) for f in hits]
    assert checks_fired(findings) == {rule} | more
    severity = "warning" if rule == "critic_divergence" else "error"  # a stop: an error
    assert {f.severity for f in hits} == {severity}


def test_nan_and_null_values_are_where_the_run_turned(tmp_path):
    def mutate(step: int, d: dict[str, Any]):
        if 150 <= step <= 160:
            d["actor/pg_loss"] = float("nan")
        if step == 170:
            d["critic/vf_loss"] = None  # what orjson writes for NaN/inf
        if step == 171:
            d["actor/grad_norm"] = float("inf")

    findings = analyse_records(tmp_path, build_run(mutate))[2]
    spans = [(f.check, f.severity, f.start_step, f.end_step) for f in findings]
    assert spans == [("non_finite", "error", 150, 160), ("non_finite", "error", 170, 170),
                     ("skipped_update", "warning", 171, 171)]  # fmt: skip


def test_every_response_at_the_runs_limit_is_a_length_collapse():
    data = rp.RunData(config={"max_response_length": 100})
    for step in range(1, 9):
        cut = step > 6
        data.merge(step, {"critic/score/mean": 0.5, "response_length/mean": 100.0 if cut else 40.0,
                          "response_length/min": 100.0 if cut else 10.0})  # fmt: skip
    (hit,) = health_checks(data, rp.canonicalize(data))
    found = (hit.check, hit.metric, hit.start_step, hit.end_step)
    assert found == ("length_collapse", "response_length_min", 7, 8)


def test_thresholds_are_tunable(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", build_run())
    assert rs.analyse(path)[2] == []
    strict = replace(THRESHOLDS, entropy_fraction=0.5)
    assert checks_fired(rs.analyse(path, strict)[2]) == {"entropy_collapse"}


RNG, SCORE, CLIP = random.Random(), "critic/score/mean", "actor/pg_clipfrac"


def longer(step: int, d: dict[str, Any]):  # the length rising from step 100, the score with it
    if step >= 100:
        d["response_length/mean"] = 260.0 * (1 + 0.02 * (step - 100))
        d[SCORE] += 0.002 * (step - 100)


def no_gain(step: int, d: dict[str, Any]):
    longer(step, d)
    d[SCORE] = 0.64 - 0.0005 * (step - 100) + 0.01 * math.sin(step) if step >= 100 else d[SCORE]


def clip_0(step: int, d: dict[str, Any]):
    d.update({"critic/score/min": 0.0, "critic/score/max": 1.0} | ({CLIP: 0.0} if step >= 100
                                                                   else {}))  # fmt: skip


def flat(step: int, d: dict[str, Any]):
    d.update({VAL_KEY: 0.30 + RNG.uniform(-0.004, 0.004)} if VAL_KEY in d else {})
    d[SCORE] = 0.15 + RNG.uniform(-0.01, 0.01)


# mutate: the check that fires alone (None: nothing), its severity, first step, in its message
TRENDS = {
    "length hacking": (longer, "length_hacking", "warning", (85, 115), ""),
    "longer, no gain": (no_gain, None, None, (0, 0), ""),
    "value loss": (lambda s, d: d.update({"critic/vf_loss": 0.2 + 0.0005 * s + 0.01 *
                   math.sin(s)}), "value_loss_not_decreasing", "warning", (1, 1), ""),
    "clip 0": (clip_0, "clip_fraction_zero", "warning", (95, 105), "clip range"),
    "clip 0, converged": (lambda s, d: clip_0(s, d) or d.update({SCORE: 0.97} if s >= 100
                          else {}), "clip_fraction_zero", "note", (95, 105), "converged"),
    "accuracy flat": (flat, "accuracy_flat", "warning", (0, 0), "val_acc"),
    "accuracy plateau": (lambda s, d: d.update({VAL_KEY: min(0.30 + 0.004 * s, 0.50)}
                         if VAL_KEY in d else {}), "accuracy_flat", "note", (40, 60), ""),
}  # fmt: skip


@pytest.mark.parametrize("case", TRENDS)
def test_a_whole_run_trend_fires_where_it_starts_and_nothing_else(tmp_path, case):
    mutate, check, severity, (first, last), said = TRENDS[case]
    RNG.seed(1)
    findings = analyse_records(tmp_path, build_run(mutate))[2]
    assert checks_fired(findings) == ({check} if severity == "warning" else set())
    assert [f.check for f in findings] == ([check] if check else []), [str(f) for f in findings]
    if check:
        (hit,) = findings
        assert hit.severity == severity and first <= hit.start_step <= last
        assert hit.end_step == STEPS and said in hit.message, str(hit)


def test_checks_stay_linear_with_many_findings():
    long, data = 60_000, rp.RunData()
    for step in range(1, long + 1):
        data.merge(step, {
            "critic/score/mean": 0.5,
            "actor/entropy": 0.4 if step <= 20 or (step // 10) % 2 else 0.001,
            "actor/grad_norm": math.nan if step % 4 == 3 else 1.0,
            "actor/pg_clipfrac": 0.0 if (step // 40) % 2 else 0.9,
            "critic/vf_loss": 0.1 if step <= 20 or (step // 20) % 2 else 50.0,
        })  # fmt: skip
    started = time.monotonic()
    findings = health_checks(data, rp.canonicalize(data))
    assert time.monotonic() - started < 20
    counts = Counter(finding.check for finding in findings)
    assert counts["skipped_update"] + counts["skipped_updates"] == long // 4
    assert abs(counts["entropy_collapse"] - long // 20) <= 2
    assert abs(counts["clipped_update"] - long // 80) <= 2
    assert abs(counts["clip_fraction_zero"] - long // 80) <= 2
    assert abs(counts["critic_divergence"] - long // 40) <= 2


def test_docs_threshold_table_is_the_dataclass():
    text = (ROOT / "docs" / "reading-a-ppo-run.md").read_text()
    assert doc_table() in text, "paste guard.thresholds.doc_table() into the docs' table"


GAP = "training/rollout_probs_diff_mean"
# Steps 1-2 of a real CPU run of verl's loop, rounded (fp32 vLLM and FSDP: docs/algorithms.md)
_KEYS = ("training/rollout_probs_diff_max", GAP, "training/rollout_probs_diff_std",
         "rollout_corr/kl")  # fmt: skip
REAL_CPU_STEPS = [
    {"training/rollout_probs_diff_valid": 1.0, "training/rollout_actor_probs_pearson_corr": 1.0,
     "rollout_corr/k3_kl": 0.0, "rollout_corr/ppl_ratio": 1.0, "rollout_corr/chi2_token": 0.0,
     **dict(zip(_KEYS, values, strict=True))}
    for values in ((1.1e-08, 4.3e-10, 6.0e-10, 1.6e-08), (4.7e-09, 3.8e-10, 5.0e-10, -1.2e-08))
]  # fmt: skip


def test_rollout_gap_warns_above_verls_harmful_level_notes_above_normal_else_silent(tmp_path):
    findings = analyse_records(tmp_path, build_run(_from(150, **{GAP: 0.02})))[2]
    assert checks_fired(findings) == {"rollout_gap"}
    hit = only(findings, "rollout_gap")
    assert hit.severity == "warning" and hit.metric == "rollout_probs_diff_mean"
    assert 144 <= hit.start_step <= 151 and hit.end_step == 200
    assert hit.evidence["bar"] == THRESHOLDS.mismatch_mean_harmful == 0.01
    assert "algorithm.rollout_correction.rollout_is=token" in hit.message
    assert "docs/algo/rollout_corr.md" in hit.message and "0.02 > 0.01" in hit.message
    findings = analyse_records(tmp_path / "n", build_run(_from(100, **{GAP: 0.007})))[2]
    assert checks_fired(findings) == set()
    hit = only(findings, "rollout_gap")
    assert hit.severity == "note" and hit.evidence["bar"] == 0.005
    on = _from(150, **{GAP: 0.02, "rollout_corr/rollout_is_mean": 0.97})
    hit = only(analyse_records(tmp_path / "c", build_run(on))[2], "rollout_gap")
    assert hit.evidence["correction_on"] is True and "rollout_is=token" not in hit.message
    assert "the rollout correction is on" in hit.message
    # silent where the engines agree (a real CPU run); a 2-step run judged whole
    records = [{"step": i + 1, "data": d} for i, d in enumerate(REAL_CPU_STEPS)]
    assert "rollout_gap" not in {f.check for f in analyse_records(tmp_path / "a", records)[2]}
    records = [{"step": i + 1, "data": {**d, GAP: 0.03}} for i, d in enumerate(REAL_CPU_STEPS)]
    hit = only(analyse_records(tmp_path / "s", records)[2], "rollout_gap")
    assert (hit.severity, hit.start_step, hit.end_step) == ("warning", 1, 2)


EVICTED = "training/filter_groups/evicted_samples"
SURPLUS = "training/filter_groups/discarded_surplus_samples"
# Steps 1-20 of the CPU DAPO run (learn_tiny.sh ALGO=dapo, seed 0, 16 prompts a step;
# docs/algorithms.md): groups dropped for no signal, surplus (None: not logged), step seconds.
REAL_DAPO = [
    (25, 7, 20.1), (12, 2, 10.6), (11, 1, 6.9), (4, None, 6.5), (10, None, 8.6), (26, 7, 15.8),
    (16, None, 11.2), (34, None, 20.2), (27, 7, 16.9), (49, 1, 19.4), (63, 1, 23.2), (63, 6, 25.0),
    (84, 3, 27.6), (68, 3, 25.4), (86, None, 28.8), (111, 3, 35.4), (69, 1, 24.1), (97, None, 32.7),
    (129, 1, 37.4), (81, None, 25.8),
]  # fmt: skip


def dapo_records(counts=REAL_DAPO) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [{"step": 0, "data": {VAL_KEY: 0.5}}]
    for step, (evicted, surplus, seconds) in enumerate(counts, start=1):
        data = {"timing_s/step": seconds, EVICTED: float(evicted)}
        records.append({"step": step, "data": data | ({SURPLUS: surplus} if surplus else {})})
    return records


def test_dapo_dropping_most_of_its_generation_warns_and_nothing_else_does(tmp_path):
    """The real DAPO run's second half, the batch size from its launch record."""
    (tmp_path / "run" / "launches").mkdir(parents=True)
    (tmp_path / "run" / "launches" / "launch-20260101T000000Z.yaml").write_text(
        "config:\n  data:\n    train_batch_size: 16\n")  # fmt: skip
    hit = only(analyse_records(tmp_path, dapo_records())[2], "dropped_groups")
    assert hit.severity == "warning" and (hit.start_step, hit.end_step) == (11, 20), str(hit)
    assert hit.evidence["peak_share"] == pytest.approx(0.85, abs=0.01)
    assert "130 groups for 16 kept at step 19" in hit.message
    assert "max_num_gen_batches" in hit.message and "docs/algorithms.md" in hit.message

    def dropped(records: list[dict[str, Any]], batch: int | None = 16) -> list[Any]:
        data = rp.RunData(config={"train_batch_size": batch} if batch else {})
        for record in records:
            data.merge(record["step"], record["data"])
        return check_dropped_groups(data, THRESHOLDS)

    assert dropped(dapo_records(REAL_DAPO[:10])) == []
    assert dropped([{"step": s, "data": {"timing_s/step": 5.0}} for s in range(1, 21)]) == []
    assert dropped(dapo_records(), batch=None) == []  # the share is not guessed
    assert dropped_groups({EVICTED: 12.0, SURPLUS: 2.0, "timing_s/step": 9.0}) == 14.0
    assert dropped_groups({"timing_s/step": 9.0}) == 0.0
