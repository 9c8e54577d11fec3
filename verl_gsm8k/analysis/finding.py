"""A health check's ``Finding`` and the helpers the checks share."""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_gsm8k.analysis.parse import Canonical


@dataclass
class Finding:
    check: str
    severity: str  # "error", "warning" or "note"
    metric: str
    start_step: int
    end_step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return (f"[{self.severity}] {self.check} ({self.metric}) steps {self.start_step}-"
                f"{self.end_step}: {self.message}")  # fmt: skip


def fmt(value: float) -> str:
    return f"{value:.4g}" if value == 0 or 1e-3 <= abs(value) < 1e5 else f"{value:.3e}"


def rolling_median(values: Sequence[float], window: int, centered: bool = True) -> list[float]:
    half, n = window // 2, len(values)
    bounds = ((max(0, i - half), min(n, i - half + window)) if centered
              else (max(0, i - window + 1), i + 1) for i in range(n))  # fmt: skip
    return [statistics.median(values[lo:hi]) for lo, hi in bounds]


def spans(flags: Sequence[bool], min_len: int = 1) -> list[tuple[int, int]]:
    """Runs of flagged points as (first, last index), at least min_len long."""
    found, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start >= min_len:
                found.append((start, i - 1))
            start = None
    return found


def aligned(canon: Canonical, a: str, b: str) -> tuple[list[int], list[float], list[float]]:
    """The steps where both series have a value, and their values there."""
    other = dict(canon.series.get(b, []))
    both = [(s, v, other[s]) for s, v in canon.series.get(a, []) if s in other]
    return [s for s, _, _ in both], [v for _, v, _ in both], [w for _, _, w in both]
