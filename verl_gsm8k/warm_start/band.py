"""The accuracy band of WARM_START_ACC (``LOW-HIGH``): standard library only, read by the knob
checks (preflight/knobs.py) and by the pick (pick.py)."""

from __future__ import annotations

import re

_BAND_RE = re.compile(r"^(\d*\.?\d+)-(\d*\.?\d+)$")


def parse_band(text: str) -> tuple[float, float]:
    """ "LOW-HIGH" with 0 <= LOW <= HIGH <= 1; ValueError with the reason otherwise."""
    match = _BAND_RE.match(text)
    if not match:
        raise ValueError(f"band {text!r} is not LOW-HIGH (e.g. 0.30-0.45)")
    low, high = float(match[1]), float(match[2])
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"band {text!r}: needs 0 <= LOW <= HIGH <= 1")
    return low, high


def distance(accuracy: float, band: tuple[float, float]) -> float:
    """0 inside the band, else how far outside it."""
    low, high = band
    return max(low - accuracy, accuracy - high, 0.0)


def is_band(text: str) -> bool:
    try:
        parse_band(text)
    except ValueError:
        return False
    return True
