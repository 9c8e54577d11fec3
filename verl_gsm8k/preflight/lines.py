"""The lines the preflight prints: one per check result (``Report`` collects them and counts the
errors and warnings), secrets masked, and the one-line summary of an exception. Shared by
verl_gsm8k/preflight/cli.py and the check modules beside it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


@dataclass
class Report:
    errors: int = 0
    warnings: int = 0
    lines: list[str] = field(default_factory=list)

    def _emit(self, tag: str, check: str, message: str) -> None:
        line = secret_free(f"preflight: [{tag}] {check}: {message}")
        self.lines.append(line)
        print(line, flush=True)

    def ok(self, check: str, message: str) -> None:
        self._emit("ok", check, message)

    def note(self, check: str, message: str) -> None:
        self._emit("note", check, message)

    def warn(self, check: str, message: str) -> None:
        self.warnings += 1
        self._emit("warn", check, message)

    def error(self, check: str, message: str) -> None:
        self.errors += 1
        self._emit("error", check, message)


def one_line(exc: BaseException) -> str:
    """The most specific line of an exception chain, without Hydra's hints."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    skip = ("full_key:", "object_type=", "To append to your config", "Set the environment")
    kept = [ln for ln in lines if not ln.startswith(skip)]
    return " ".join(kept or lines)[:400]


def secret_free(text: str) -> str:
    """Replace the value of any secret-looking environment variable that appears in text."""
    for name, value in os.environ.items():
        if value and len(value) >= 6 and any(m in name.upper() for m in SECRET_MARKERS):
            text = text.replace(value, f"<{name}>")
    return text
