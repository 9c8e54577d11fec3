"""What a guarded run leaves beside its metrics, for the report: the watchdog's trips
(``RUN_DIR/watchdog.jsonl``) and the kept best checkpoint (``RUN_DIR/best_checkpoint.json``),
both read with verl_gsm8k/common/run_dir.py, the trainer's own reader.

Standard library only. A trip becomes a health finding (an error when the watchdog stopped the
run, a warning when it only warned) and a row of the report's watchdog table; the best checkpoint
is named on the page and in summary.json; an unreadable best_checkpoint.json is one input problem.
A run without either file (a file input, a run before the watchdog) gets nothing extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.finding import Finding, fmt
from verl_gsm8k.analysis.parse import ParseIssue
from verl_gsm8k.common.run_dir import BestError, best_path, read_best, read_trips, step_name


@dataclass
class GuardRecords:
    trips: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    problem: ParseIssue | None = None  # best_checkpoint.json exists and cannot be read


def read_guard(path: Path) -> GuardRecords:
    """The trips and the best checkpoint of a run directory; nothing for a metrics file."""
    if not path.is_dir():
        return GuardRecords()
    records = GuardRecords(trips=read_trips(path))
    try:
        records.best = read_best(path)
    except BestError as err:
        where = str(best_path(path))
        why = str(err).removeprefix(f"{where}: ")
        records.problem = ParseIssue(where, None, f"{why}; the kept best checkpoint is not named")
    return records


def value_text(value: Any) -> str:
    """A trip's value as the watchdog saw it: NaN and infinities by name, numbers short."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "null" if value is None else str(value)
    if value != value:  # NaN
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return fmt(float(value))


def trip_line(trip: dict[str, Any]) -> str:
    """One trip in words: step, rule, metric, value, threshold, action, last healthy checkpoint."""
    healthy = trip.get("last_healthy_checkpoint")
    return (
        f"step {trip['step']}: {trip.get('rule', '?')} on {trip.get('metric', '?')} = "
        f"{value_text(trip.get('value'))} (threshold {trip.get('threshold', '?')}); action "
        f"{trip.get('action', '?')}; last healthy checkpoint: "
        + ("none" if healthy is None else step_name(healthy))
    )


def trip_findings(trips: list[dict[str, Any]]) -> list[Finding]:
    """Each trip as a health finding at its step (shaded on every curve, like NaN/inf)."""
    return [
        Finding(
            "watchdog",
            "error" if trip.get("action") == "stop" else "warning",
            str(trip.get("metric", "?")),
            trip["step"],
            trip["step"],
            f"the watchdog tripped at {trip_line(trip)}",
            {
                k: trip.get(k)
                for k in (
                    "rule",
                    "value",
                    "threshold",
                    "action",
                    "launch",
                    "last_healthy_checkpoint",
                )
            },
        )  # fmt: skip
        for trip in trips
    ]


def guard_summary(records: GuardRecords) -> dict[str, Any]:
    """summary.json's keys: every trip as logged (its text added), the best checkpoint or None."""
    return {
        "watchdog_trips": [
            dict(trip, value_text=value_text(trip.get("value"))) for trip in records.trips
        ],  # fmt: skip
        "best_checkpoint": records.best,
        "best_checkpoint_problem": str(records.problem) if records.problem else None,
    }


def best_text(best: dict[str, Any]) -> str:
    return f"step {best['step']} ({best.get('metric', '?')} = {value_text(best['value'])})"
