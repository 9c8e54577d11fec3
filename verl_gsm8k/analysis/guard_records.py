"""The watchdog's trips and the kept best of a guarded run."""

import math
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.finding import Finding, fmt
from verl_gsm8k.analysis.parse import to_float
from verl_gsm8k.common import run_dir as rd

TRIP_KEYS = ("rule", "value", "threshold", "action", "launch", "last_healthy_checkpoint")


def read_guard(path: Path, issues: list[str]) -> dict[str, Any]:
    trips = rd.read_trips(path) if path.is_dir() else []
    best = problem = None
    try:
        best = rd.read_best(path) if path.is_dir() else None
    except rd.BestError as err:
        problem = f"{err}; the kept best checkpoint is not named"
        issues.append(problem)
    trips = [dict(t, value_text=value_text(t.get("value"))) for t in trips]
    return {"watchdog_trips": trips, "best_checkpoint": best, "best_checkpoint_problem": problem}


def value_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "null" if value is None else str(value)
    number = to_float(value) or 0.0
    return "NaN" if math.isnan(number) else fmt(number) if math.isfinite(number) else f"{number}"


def healthy_text(trip: dict[str, Any]) -> str:
    healthy = trip.get("last_healthy_checkpoint")
    return "none" if healthy is None else rd.step_name(healthy)


def trip_line(trip: dict[str, Any]) -> str:
    value, healthy = value_text(trip.get("value")), healthy_text(trip)
    return (f"step {trip['step']}: {trip.get('rule', '?')} on {trip.get('metric', '?')} = {value} "
            f"(threshold {trip.get('threshold', '?')}); action {trip.get('action', '?')}; last "
            f"healthy checkpoint: {healthy}")  # fmt: skip


def trip_findings(trips: list[dict[str, Any]]) -> list[Finding]:
    return [Finding("watchdog", "error" if t.get("action") == "stop" else "warning",
                    str(t.get("metric", "?")), t["step"], t["step"],
                    f"the watchdog tripped at {trip_line(t)}", {k: t.get(k) for k in TRIP_KEYS})
            for t in trips]  # fmt: skip


def best_text(best: dict[str, Any]) -> str:
    return f"step {best['step']} ({best.get('metric', '?')} = {value_text(best['value'])})"
