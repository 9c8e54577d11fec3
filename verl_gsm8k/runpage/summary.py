"""One run's summary (validation, time per phase, throughput, metrics, findings) as plain JSON.

Standard library only. ``analyse`` is the one call that loads, canonicalises, checks and
summarises an input.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.checks import health_checks
from verl_gsm8k.analysis.finding import Finding
from verl_gsm8k.analysis.guard_records import guard_summary, read_guard, trip_findings
from verl_gsm8k.analysis.parse import (
    Canonical,
    RunData,
    Series,
    canonicalize,
    load_run,
)
from verl_gsm8k.analysis.thresholds import THRESHOLDS, Thresholds
from verl_gsm8k.analysis.vocab import (
    MEMORY_ROLES,
    OUTSIDE_STEP_PHASES,
    PHASE_ORDER,
    metric_label,
)
from verl_gsm8k.replay.checks import trace_checks
from verl_gsm8k.replay.load import Trace

# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def time_breakdown(canon: Canonical) -> dict[str, Any]:
    """Seconds per phase over the run, with "other" = step time not covered by a phase.

    Wall-clock is the sum of step times plus the phases verl times outside its step timer
    (validation). For older logs without a step timer the step time is the sum of the phases.
    """
    step_time = dict(canon.series.get("step_time", []))
    totals: dict[str, float] = {}
    other_by_step: Series = []
    overrun = 0.0
    per_step_in: dict[int, float] = {}
    for phase, points in canon.phases.items():
        totals[phase] = sum(v for _, v in points)
        if phase not in OUTSIDE_STEP_PHASES:
            for step, value in points:
                per_step_in[step] = per_step_in.get(step, 0.0) + value
    for step, seconds in step_time.items():
        rest = seconds - per_step_in.get(step, 0.0)
        overrun = max(overrun, -rest)
        other_by_step.append((step, max(rest, 0.0)))
    other_total = sum(v for _, v in other_by_step)
    if other_total > 0:
        totals["other"] = other_total
    steps_total = sum(step_time.values())
    outside = sum(v for k, v in totals.items() if k in OUTSIDE_STEP_PHASES)
    wall = steps_total + outside
    ordered = sorted(totals, key=lambda k: (PHASE_ORDER.index(k) if k in PHASE_ORDER else 99, k))
    denom = sum(totals.values())
    return {
        "wall_clock_s": wall,
        "step_time_total_s": steps_total,
        "step_time_derived": canon.step_time_derived,
        "max_phase_overrun_s": overrun,
        "phases": {
            k: {
                "total_s": totals[k],
                "share": totals[k] / denom if denom else 0.0,
                "inside_step": k not in OUTSIDE_STEP_PHASES,
            }
            for k in ordered
        },
        "other_by_step": other_by_step,
    }


def memory_peaks(canon: Canonical) -> dict[str, Any]:
    """Peak GPU memory per role (GiB, with the step it was reached) and peak host memory in use.

    Roles come from verl 0.9.1's role-prefixed engine metrics (actor/perf/..., critic/perf/...);
    an older log's unprefixed perf/max_memory_allocated_gb is shown under "role not named".
    """

    def peak(name: str) -> dict[str, Any] | None:
        points = canon.series.get(name)
        if not points:
            return None
        step, value = max(points, key=lambda p: p[1])
        return {"gb": value, "step": step, "key": canon.source_keys.get(name)}

    gpu: dict[str, dict[str, Any]] = {}
    for role, (allocated, reserved) in MEMORY_ROLES.items():
        peaks = {"allocated": peak(allocated), "reserved": peak(reserved)}
        if any(peaks.values()):
            gpu[role] = peaks
    return {"gpu": gpu, "host_used": peak("cpu_memory_used_gb")}


def _median_or_none(points: Series) -> float | None:
    return statistics.median(v for _, v in points) if points else None


def summarize(
    data: RunData,
    canon: Canonical,
    findings: list[Finding],
    thresholds: Thresholds = THRESHOLDS,
) -> dict[str, Any]:
    """Everything a reader (or a script) needs, as plain JSON-able values."""
    steps = canon.all_steps
    score = canon.series.get("score", [])
    breakdown = time_breakdown(canon)
    breakdown.pop("other_by_step")
    gaps = [b for a, b in zip(steps, steps[1:], strict=False) if b != a + 1]
    return {
        "sources": data.sources,
        "formats": sorted(set(data.formats)),
        "steps": {
            "count": len(steps),
            "first": steps[0] if steps else None,
            "last": steps[-1] if steps else None,
            "gaps_before": gaps,
        },
        "validation": _validation(data, canon),
        "train_score": {
            "first": score[0][1] if score else None,
            "final": score[-1][1] if score else None,
            "first_median_10": _median_or_none(score[:10]) if score else None,
            "final_median_10": _median_or_none(score[-10:]) if score else None,
        },
        "time": breakdown,
        "memory": memory_peaks(canon),
        "throughput": _throughput(data, canon),
        "metrics": _metrics(canon),
        "health": [f.as_dict() for f in findings],
        "health_counts": {
            sev: sum(f.severity == sev for f in findings) for sev in ("error", "warning", "note")
        },
        "parse_issues": [str(issue) for issue in data.issues],
        "thresholds": asdict(thresholds),
    }


def _validation(data: RunData, canon: Canonical) -> dict[str, Any]:
    """The validation accuracy: its best (first step reaching it), final and first values, and
    the steps whose validation was logged as NaN or null."""
    val = canon.series.get("val_acc", [])
    best = final = None
    if val:
        top = max(v for _, v in val)
        at = [s for s, v in val if v == top]
        best = {"value": top, "step": at[0], "also_at": at[1:]}
        final = {"value": val[-1][1], "step": val[-1][0]}
    key = canon.val_key or ""
    # validations logged as NaN or null (a sick run): left out of the series, named here
    val_not_finite = [s for s, v in data.steps.items() if key in v and not math.isfinite(v[key])]
    return {
        "key": canon.val_key,
        "points": len(val),
        "best": best,
        "final": final,
        "first": {"value": val[0][1], "step": val[0][0]} if val else None,
        "not_finite_steps": val_not_finite,
        "problems": data.val_problems,
        "problems_from": data.val_problems_from,
    }


def _throughput(data: RunData, canon: Canonical) -> dict[str, Any]:
    """Tokens per second over the whole run, the median per GPU, and what they rest on."""
    throughput = canon.series.get("throughput", [])
    tokens = canon.series.get("total_tokens", [])
    step_time = dict(canon.series.get("step_time", []))
    # Overall rate = tokens of all steps / time of those steps (a time-weighted mean).
    if tokens and step_time:
        total_tok = sum(v for s, v in tokens if s in step_time)
        secs = sum(step_time[s] for s, _ in tokens if s in step_time)
    else:
        total_tok = sum(v * step_time[s] for s, v in throughput if s in step_time)
        secs = sum(step_time[s] for s, _ in throughput if s in step_time)
    return {
        "tokens_per_s": total_tok / secs if secs else None,
        "median_tokens_per_s_per_gpu": _median_or_none(throughput),
        "estimated": canon.throughput_estimated,
        "basis": (
            f"estimated: train_batch_size={data.config.get('train_batch_size')} x "
            f"rollout.n={data.config.get('rollout_n', 1)} x (prompt + response length) / "
            "step time, one GPU"
            if canon.throughput_estimated
            else "perf/throughput and perf/total_num_tokens as logged"
            if throughput
            else "not logged"
        ),
    }


def _metrics(canon: Canonical) -> dict[str, dict[str, Any]]:
    """Every canonical metric: its meaning, the key it was read from, a few of its values."""
    return {
        name: {
            "label": metric_label(name),
            "key": canon.source_keys.get(name),
            "points": len(points),
            "first": points[0][1],
            "last": points[-1][1],
            "min": min(v for _, v in points),
            "median": statistics.median(v for _, v in points),
            "max": max(v for _, v in points),
        }
        for name, points in sorted(canon.series.items())
    }


def json_safe(value: Any) -> Any:
    """Plain JSON: tuples become lists, non-finite floats (e.g. an overflowing sum) null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def analyse(
    path: Path, thresholds: Thresholds = THRESHOLDS, trace: Trace | None = None
) -> tuple[RunData, Canonical, list[Finding], dict[str, Any]]:
    """Load, canonicalise, check and summarise one input (with the checks of its per-token
    ``trace``, when given: verl_gsm8k/replay/checks.py; and a run directory's watchdog trips and
    kept best checkpoint: analysis/guard_records.py)."""
    data = load_run(path)
    canon = canonicalize(data)
    guard = read_guard(path)  # the watchdog's trips, the kept best (analysis/guard_records.py)
    if guard.problem:
        data.issues.append(guard.problem)
    more = (trace_checks(trace, thresholds) if trace else []) + trip_findings(guard.trips)
    findings = health_checks(data, canon, thresholds, more)
    summary = summarize(data, canon, findings, thresholds)
    summary.update(guard_summary(guard))
    return data, canon, findings, summary
