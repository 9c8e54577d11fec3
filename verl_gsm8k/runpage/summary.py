"""One run read, checked and summarised as plain JSON (``analyse``)."""

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.checks import health_checks
from verl_gsm8k.analysis.finding import Finding
from verl_gsm8k.analysis.guard_records import read_guard, trip_findings
from verl_gsm8k.analysis.parse import Canonical, RunData, Series, canonicalize, load_run
from verl_gsm8k.guard.thresholds import THRESHOLDS, Thresholds
from verl_gsm8k.guard.vocab import MEMORY_ROLES, OUTSIDE_STEP_PHASES, metric_label, phase_order
from verl_gsm8k.replay.checks import trace_checks
from verl_gsm8k.replay.load import Trace


def time_breakdown(canon: Canonical) -> dict[str, Any]:
    """Seconds per phase ("other": the step time no phase covers)."""
    step_time = dict(canon.series.get("step_time", []))
    inside: dict[int, float] = {}
    totals = {phase: sum(v for _, v in points) for phase, points in canon.phases.items()}
    for phase, points in canon.phases.items():
        for step, value in points if phase not in OUTSIDE_STEP_PHASES else []:
            inside[step] = inside.get(step, 0.0) + value
    other = [(s, max(t - inside.get(s, 0.0), 0.0)) for s, t in step_time.items()]
    if sum(v for _, v in other) > 0:
        totals["other"] = sum(v for _, v in other)
    steps, denom = sum(step_time.values()), sum(totals.values())
    phases = {k: {"total_s": totals[k], "share": totals[k] / denom if denom else 0.0,
                  "inside_step": k not in OUTSIDE_STEP_PHASES}
              for k in sorted(totals, key=phase_order)}  # fmt: skip
    return {"wall_clock_s": steps + sum(v for k, v in totals.items() if k in OUTSIDE_STEP_PHASES),
            "step_time_total_s": steps, "step_time_derived": canon.step_time_derived,
            "phases": phases, "other_by_step": other}  # fmt: skip


def _peak(canon: Canonical, name: str) -> dict[str, Any] | None:
    points = canon.series.get(name)
    if not points:
        return None
    step, value = max(points, key=lambda p: p[1])
    return {"gb": value, "step": step, "key": canon.source_keys.get(name)}


def _median(points: Series) -> float | None:
    return statistics.median(v for _, v in points) if points else None


def _validation(data: RunData, canon: Canonical) -> dict[str, Any]:
    val = canon.series.get("val_acc", [])
    top = max((v for _, v in val), default=None)
    at = [s for s, v in val if v == top]
    key = canon.val_key or ""
    return {"key": canon.val_key, "points": len(val),
            "best": {"value": top, "step": at[0], "also_at": at[1:]} if val else None,
            "final": {"value": val[-1][1], "step": val[-1][0]} if val else None,
            "first": {"value": val[0][1], "step": val[0][0]} if val else None,
            "not_finite_steps": [s for s, v in data.steps.items()
                                 if key in v and not math.isfinite(v[key])],
            "problems": data.val_problems, "problems_from": data.val_problems_from}  # fmt: skip


def _throughput(data: RunData, canon: Canonical) -> dict[str, Any]:
    rate = canon.series.get("throughput", [])
    times = dict(canon.series.get("step_time", []))
    tokens = canon.series.get("total_tokens") or [(s, v * times.get(s, 0)) for s, v in rate]
    secs = sum(times[s] for s, _ in tokens if s in times)
    basis = "not logged" if not rate else "perf/throughput and perf/total_num_tokens as logged"
    if canon.throughput_estimated:
        basis = (f"estimated: train_batch_size={data.config.get('train_batch_size')} x "
                 f"rollout.n={data.config.get('rollout_n', 1)} x (prompt + response length) / "
                 "step time, one GPU")  # fmt: skip
    return {"tokens_per_s": sum(v for s, v in tokens if s in times) / secs if secs else None,
            "median_tokens_per_s_per_gpu": _median(rate),
            "estimated": canon.throughput_estimated, "basis": basis}  # fmt: skip


def _stats(name: str, p: Series, canon: Canonical) -> dict[str, Any]:
    values = [v for _, v in p]
    return {"label": metric_label(name), "key": canon.source_keys.get(name), "points": len(p),
            "first": values[0], "last": values[-1], "min": min(values),
            "median": statistics.median(values), "max": max(values)}  # fmt: skip


def summarize(data: RunData, canon: Canonical, findings: list[Finding],
              thresholds: Thresholds = THRESHOLDS) -> dict[str, Any]:  # fmt: skip
    steps, score = canon.all_steps, canon.series.get("score", [])
    time = time_breakdown(canon)
    del time["other_by_step"]
    gaps = [b for a, b in zip(steps, steps[1:], strict=False) if b > a + 1]
    ends = (steps[0], steps[-1]) if steps else (None, None)
    scores = (score[0][1], score[-1][1]) if score else (None, None)
    gpu = {role: {"allocated": _peak(canon, a), "reserved": _peak(canon, r)}
           for role, (a, r) in MEMORY_ROLES.items()}  # fmt: skip
    gpu = {role: peaks for role, peaks in gpu.items() if any(peaks.values())}
    counts = {sev: sum(f.severity == sev for f in findings) for sev in ("error", "warning", "note")}
    return {"sources": data.sources, "formats": sorted(set(data.formats)),
            "steps": dict(count=len(steps), first=ends[0], last=ends[1], gaps_before=gaps),
            "validation": _validation(data, canon),
            "train_score": dict(first=scores[0], final=scores[1], first_median_10=_median(
                score[:10]), final_median_10=_median(score[-10:])),
            "time": time, "memory": {"gpu": gpu, "host_used": _peak(canon, "cpu_memory_used_gb")},
            "throughput": _throughput(data, canon),
            "metrics": {name: _stats(name, p, canon) for name, p in sorted(canon.series.items())},
            "health": [asdict(f) for f in findings], "health_counts": counts,
            "parse_issues": list(data.issues), "thresholds": asdict(thresholds)}  # fmt: skip


def json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class NothingReadError(Exception):
    """No metric could be read."""


def analyse(path: Path, thresholds: Thresholds = THRESHOLDS, trace: Trace | None = None
            ) -> tuple[RunData, Canonical, list[Finding], dict[str, Any]]:  # fmt: skip
    data = load_run(path)
    if not data.steps:
        detail = f" ({data.issues[0]})" if data.issues else ""
        raise NothingReadError(f"no metrics could be read from {path}{detail}")
    canon = canonicalize(data)
    guard = read_guard(path, data.issues)
    more = trace_checks(trace, thresholds) if trace else []
    more += trip_findings(guard["watchdog_trips"])
    findings = health_checks(data, canon, thresholds, more)
    return data, canon, findings, {**summarize(data, canon, findings, thresholds), **guard}
