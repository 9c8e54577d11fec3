"""Text from a file, shown on a terminal: one line, control and format characters escaped."""

import unicodedata

_ESCAPED = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, format, surrogates, unassigned


def clean(value: object) -> str:
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) in _ESCAPED else ch for ch in text)
