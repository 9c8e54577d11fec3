"""What a health check returns (``Finding``) and the helpers every check shares: rolling
medians, runs of flagged points, two series aligned on their common steps, number formatting.

Standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from verl_gsm8k.analysis.parse import Canonical


@dataclass
class Finding:
    """One health-check result: what fired, where, and the numbers behind it."""

    check: str
    severity: str  # "error", "warning" or "note"
    metric: str
    start_step: int
    end_step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"[{self.severity}] {self.check} ({self.metric}) steps {self.start_step}-"
            f"{self.end_step}: {self.message}"
        )


def fmt(value: float) -> str:
    """A number for a finding's message: four significant digits, or scientific if tiny/huge."""
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.3e}"


def rolling_median(values: Sequence[float], window: int, centered: bool = True) -> list[float]:
    """Median over a sliding window (truncated at the ends)."""
    out: list[float] = []
    n = len(values)
    half = window // 2
    for i in range(n):
        if centered:
            lo, hi = max(0, i - half), min(n, i - half + window)
        else:
            lo, hi = max(0, i - window + 1), i + 1
        out.append(statistics.median(values[lo:hi]))
    return out


def spans(flags: Sequence[bool], min_len: int = 1) -> list[tuple[int, int]]:
    """Runs of consecutive flagged points as (first index, last index), at least min_len long.

    Checks slice their series with these indices, so that each run costs its own length and a
    check stays linear in the number of steps however many runs there are.
    """
    found: list[tuple[int, int]] = []
    start: int | None = None
    for i, flag in enumerate(flags):
        if flag and start is None:
            start = i
        if start is not None and (not flag or i == len(flags) - 1):
            end = i if flag else i - 1
            if end - start + 1 >= min_len:
                found.append((start, end))
            start = None
    return found


def aligned(canon: Canonical, a: str, b: str) -> tuple[list[int], list[float], list[float]]:
    """The steps where both canonical series have a value, and their values there."""
    other = dict(canon.series.get(b, []))
    steps, xs, ys = [], [], []
    for step, value in canon.series.get(a, []):
        if step in other:
            steps.append(step)
            xs.append(value)
            ys.append(other[step])
    return steps, xs, ys
