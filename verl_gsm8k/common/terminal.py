"""Text from a file, shown on a terminal: one line, every control or invisible format character
escaped (``\\x1b``, ``\\n``, ``\\u202e``), so a shared run directory's names cannot retitle or
rewrite a terminal. Standard library only."""

import unicodedata

_ESCAPED = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, format, surrogates, unassigned


def clean(value: object) -> str:
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) in _ESCAPED else ch for ch in text)
