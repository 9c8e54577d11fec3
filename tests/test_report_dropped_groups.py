"""The report's check of DAPO's dynamic sampling (analysis/checks.check_dropped_groups): the
share of the prompt groups a step generated that verl's v1 trainer dropped (no signal, or
surplus), read from its real metric names, with a real CPU DAPO run's counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from report_runs import analyse_records, only

from verl_gsm8k.analysis.checks import check_dropped_groups, dropped_groups
from verl_gsm8k.analysis.parse import load_run
from verl_gsm8k.guard.thresholds import THRESHOLDS

EVICTED = "training/filter_groups/evicted_samples"
SURPLUS = "training/filter_groups/discarded_surplus_samples"
# Steps 1-20 of the CPU DAPO run on the converged toy task (recipes/learn_tiny.sh ALGO=dapo,
# seed 0, 16 prompts a step; docs/algorithms.md, "On the CPU toy task"): groups dropped for no
# signal, surplus groups dropped (None: not logged that step), step time in seconds.
REAL_DAPO = [
    (25, 7, 20.1), (12, 2, 10.6), (11, 1, 6.9), (4, None, 6.5), (10, None, 8.6), (26, 7, 15.8),
    (16, None, 11.2), (34, None, 20.2), (27, 7, 16.9), (49, 1, 19.4), (63, 1, 23.2), (63, 6, 25.0),
    (84, 3, 27.6), (68, 3, 25.4), (86, None, 28.8), (111, 3, 35.4), (69, 1, 24.1), (97, None, 32.7),
    (129, 1, 37.4), (81, None, 25.8),
]  # fmt: skip


def dapo_records(counts=REAL_DAPO) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [
        {"step": 0, "data": {"val-core/openai/gsm8k/acc/mean@1": 0.49}}
    ]
    for step, (evicted, surplus, seconds) in enumerate(counts, start=1):
        data: dict[str, Any] = {"timing_s/step": seconds, EVICTED: float(evicted)}
        if surplus is not None:
            data[SURPLUS] = float(surplus)
        records.append({"step": step, "data": data})
    return records


def analysed(tmp_path: Path, records: list[dict[str, Any]], batch: int | None = 16):
    run = tmp_path / "run"
    if (
        batch is not None
    ):  # the launch record's resolved config (verl_gsm8k/common/launch_record.py)
        (run / "launches").mkdir(parents=True)
        (run / "launches" / "launch-20260101T000000Z.yaml").write_text(
            f"config:\n  data:\n    train_batch_size: {batch}\n"
        )
    return analyse_records(tmp_path, records)[2], run


def test_the_real_dapo_run_drops_most_of_its_generation_in_its_second_half(tmp_path):
    findings, _ = analysed(tmp_path, dapo_records())
    hit = only(findings, "dropped_groups")
    assert hit.severity == "warning"
    assert (hit.start_step, hit.end_step) == (11, 20), str(hit)
    assert hit.evidence["peak_share"] == pytest.approx(0.85, abs=0.01)
    assert "130 groups for 16 kept at step 19" in hit.message, hit.message
    assert "max_num_gen_batches" in hit.message and "docs/algorithms.md" in hit.message


def test_its_first_half_and_other_algorithms_raise_nothing(tmp_path):
    findings, _ = analysed(tmp_path / "first", dapo_records(REAL_DAPO[:10]))
    assert "dropped_groups" not in {f.check for f in findings}
    grpo = [{"step": s, "data": {"timing_s/step": 5.0}} for s in range(1, 21)]  # no filter metrics
    findings, _ = analysed(tmp_path / "grpo", grpo)
    assert "dropped_groups" not in {f.check for f in findings}


def test_without_the_batch_size_the_share_is_not_guessed(tmp_path):
    findings, run = analysed(tmp_path, dapo_records(), batch=None)
    assert "dropped_groups" not in {f.check for f in findings}
    assert check_dropped_groups(load_run(run), THRESHOLDS) == []


def test_both_counts_are_groups_and_add_up():
    assert dropped_groups({EVICTED: 12.0, SURPLUS: 2.0, "timing_s/step": 9.0}) == 14.0
    assert dropped_groups({"timing_s/step": 9.0}) == 0.0
