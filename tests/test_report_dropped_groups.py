"""The report's check of DAPO's dynamic sampling (analysis/checks.check_dropped_groups): the
share of the prompt groups a step generated that verl's v1 trainer dropped (no signal, or
surplus), read from its real metric names, with a real CPU DAPO run's counts."""

from __future__ import annotations

from typing import Any

import pytest
from report_runs import analyse_records, only

from verl_gsm8k.analysis.checks import check_dropped_groups, dropped_groups
from verl_gsm8k.analysis.parse import RunData
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
    records: list[dict[str, Any]] = [{"step": 0, "data": {"val-core/openai/gsm8k/acc/mean@1": 0.5}}]
    for step, (evicted, surplus, seconds) in enumerate(counts, start=1):
        data = {"timing_s/step": seconds, EVICTED: float(evicted)}
        data |= {} if surplus is None else {SURPLUS: surplus}
        records.append({"step": step, "data": data})
    return records


def dropped(records: list[dict[str, Any]], batch: int | None = 16) -> list[Any]:
    data = RunData(config={"train_batch_size": batch} if batch else {})
    for record in records:
        data.merge(record["step"], record["data"])
    return check_dropped_groups(data, THRESHOLDS)


def test_the_real_dapo_run_drops_most_of_its_generation_in_its_second_half(tmp_path):
    """Read through the whole report: the batch size from the run's launch record."""
    launches = tmp_path / "run" / "launches"
    launches.mkdir(parents=True)
    (launches / "launch-20260101T000000Z.yaml").write_text(
        "config:\n  data:\n    train_batch_size: 16\n")  # fmt: skip
    hit = only(analyse_records(tmp_path, dapo_records())[2], "dropped_groups")
    assert hit.severity == "warning"
    assert (hit.start_step, hit.end_step) == (11, 20), str(hit)
    assert hit.evidence["peak_share"] == pytest.approx(0.85, abs=0.01)
    assert "130 groups for 16 kept at step 19" in hit.message, hit.message
    assert "max_num_gen_batches" in hit.message and "docs/algorithms.md" in hit.message


def test_its_first_half_other_algorithms_and_an_unknown_batch_raise_nothing():
    assert dropped(dapo_records(REAL_DAPO[:10])) == []
    assert dropped([{"step": s, "data": {"timing_s/step": 5.0}} for s in range(1, 21)]) == []
    assert dropped(dapo_records(), batch=None) == []  # the share is not guessed
    assert dropped_groups({EVICTED: 12.0, SURPLUS: 2.0, "timing_s/step": 9.0}) == 14.0  # groups
    assert dropped_groups({"timing_s/step": 9.0}) == 0.0
