"""The report's train/inference gap check (checks.check_rollout_gap): the mean per-token
|p_rollout - p_training| that verl 0.9.1 logs (training/rollout_probs_diff_mean, with
actor_rollout_ref.rollout.calculate_log_probs=True, its default) against the levels verl's FAQ
gives (normal below 0.005, a precision problem above 0.01), with the correction verl offers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from report_runs import analyse_records, build_run, checks_fired, only

from verl_gsm8k.guard.thresholds import THRESHOLDS

GAP = "training/rollout_probs_diff_mean"

# The mismatch metrics of steps 1 and 2 of a real CPU run of verl's loop (the smoke recipe's
# tiny model, fp32 vLLM and fp32 FSDP; docs/algorithms.md, "Train/inference mismatch"): the two
# engines agree to float32 rounding.
_KEYS = ("training/rollout_probs_diff_max", GAP, "training/rollout_probs_diff_std",
         "rollout_corr/kl")  # fmt: skip
REAL_CPU_STEPS = [
    {"training/rollout_probs_diff_valid": 1.0, "training/rollout_actor_probs_pearson_corr": 1.0,
     "rollout_corr/k3_kl": 0.0, "rollout_corr/ppl_ratio": 1.0, "rollout_corr/chi2_token": 0.0,
     **dict(zip(_KEYS, values, strict=True))}
    for values in ((1.1175870895385742e-08, 4.268985442923423e-10, 6.012844666614114e-10,
                    1.561693707685663e-08),
                   (4.6566128730773926e-09, 3.7803188357443673e-10, 4.9762832743383e-10,
                    -1.207482380749525e-08))
]  # fmt: skip


def gap_from(start: int, value: float, **more: float):
    def mutate(step: int, d: dict[str, Any]) -> None:
        if step >= start:
            d[GAP] = value
            d.update(more)

    return mutate


def test_a_gap_above_verls_harmful_level_is_a_warning_with_the_correction(tmp_path: Path) -> None:
    findings = analyse_records(tmp_path, build_run(gap_from(150, 0.02)))[2]
    assert checks_fired(findings) == {"rollout_gap"}
    hit = only(findings, "rollout_gap")
    assert hit.severity == "warning" and hit.metric == "rollout_probs_diff_mean"
    assert 144 <= hit.start_step <= 151 and hit.end_step == 200
    assert hit.evidence["bar"] == THRESHOLDS.mismatch_mean_harmful == 0.01
    assert "algorithm.rollout_correction.rollout_is=token" in hit.message
    assert "docs/algo/rollout_corr.md" in hit.message and "0.02 > 0.01" in hit.message


def test_a_gap_between_normal_and_harmful_is_a_note(tmp_path: Path) -> None:
    findings = analyse_records(tmp_path, build_run(gap_from(100, 0.007)))[2]
    assert checks_fired(findings) == set()
    hit = only(findings, "rollout_gap")
    assert hit.severity == "note" and hit.evidence["bar"] == 0.005


def test_with_the_correction_on_the_finding_says_so(tmp_path: Path) -> None:
    mutate = gap_from(150, 0.02, **{"rollout_corr/rollout_is_mean": 0.97})
    hit = only(analyse_records(tmp_path, build_run(mutate))[2], "rollout_gap")
    assert hit.evidence["correction_on"] is True
    assert "the rollout correction is on" in hit.message
    assert "rollout_is=token" not in hit.message


def test_engines_in_step_raise_nothing(tmp_path: Path) -> None:
    """The healthy synthetic run (a gap of ~0.003) and the real CPU run's two steps (~4e-10)."""
    findings = analyse_records(tmp_path / "synthetic", build_run())[2]
    assert "rollout_gap" not in {f.check for f in findings}
    records = [{"step": i + 1, "data": d} for i, d in enumerate(REAL_CPU_STEPS)]
    findings = analyse_records(tmp_path / "cpu", records)[2]
    assert "rollout_gap" not in {f.check for f in findings}


def test_a_short_run_is_judged_on_all_its_steps(tmp_path: Path) -> None:
    """A two-step run (the CPU smoke run's length) with a harmful gap on both steps."""
    records = [{"step": i + 1, "data": {**d, GAP: 0.03}} for i, d in enumerate(REAL_CPU_STEPS)]
    hit = only(analyse_records(tmp_path, records)[2], "rollout_gap")
    assert (hit.severity, hit.start_step, hit.end_step) == ("warning", 1, 2)
