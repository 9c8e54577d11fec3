"""WARM_START_ACC's band, ``LOW-HIGH`` (stdlib only: the knob checks read it too)."""

from __future__ import annotations

import re


def parse_band(text: str) -> tuple[float, float]:
    """``LOW-HIGH`` with 0 <= LOW <= HIGH <= 1; ValueError saying why otherwise."""
    match = re.fullmatch(r"(\d*\.?\d+)-(\d*\.?\d+)", text)
    if not match:
        raise ValueError(f"band {text!r} is not LOW-HIGH (e.g. 0.30-0.45)")
    low, high = float(match[1]), float(match[2])
    if not low <= high <= 1.0:
        raise ValueError(f"band {text!r}: needs 0 <= LOW <= HIGH <= 1")
    return low, high


def is_band(text: str) -> bool:
    try:
        return bool(parse_band(text))
    except ValueError:
        return False


def distance(accuracy: float, band: tuple[float, float]) -> float:
    """0 inside the band, else how far outside it."""
    return max(band[0] - accuracy, accuracy - band[1], 0.0)
