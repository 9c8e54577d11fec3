"""Text from a file shown on a terminal: one line, its control characters escaped.

A run directory may come from a shared folder; a metric name, a watchdog message or a checkpoint
record's name printed raw could carry terminal escapes (``\\x1b]0;...`` retitles a terminal,
others rewrite what is on the screen) or break the one-line output. Standard library only.
"""

from __future__ import annotations

import unicodedata

_ESCAPED = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, format, surrogates, unassigned


def clean(value: object) -> str:
    """``str(value)`` with every control or invisible format character written as its escape
    (``\\x1b``, ``\\n``, ``\\u202e``): printable text passes unchanged."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) in _ESCAPED else ch for ch in text)
