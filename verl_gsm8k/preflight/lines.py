"""The preflight's lines: counted, secrets masked, control characters escaped."""

import os
from dataclasses import dataclass, field
from functools import partialmethod

from verl_gsm8k.common.terminal import clean

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


@dataclass
class Report:
    errors: int = 0
    warnings: int = 0
    lines: list[str] = field(default_factory=list)

    def _emit(self, tag: str, check: str, message: str) -> None:
        self.errors += tag == "error"
        self.warnings += tag == "warn"
        line = f"preflight: [{tag}] {check}: {message}"
        for name, value in os.environ.items():  # a secret is named, never printed
            if value and len(value) >= 6 and any(m in name.upper() for m in SECRET_MARKERS):
                line = line.replace(value, f"<{name}>")
        line = clean(line)
        self.lines.append(line)
        print(line, flush=True)

    def verdict(self, check: str, problems: list[str], ok: str = "") -> bool:
        """Each problem an error, or the ``ok`` line when there is none; True if none."""
        for problem in problems:
            self.error(check, problem)
        if ok and not problems:
            self.ok(check, ok)
        return not problems

    ok = partialmethod(_emit, "ok")
    note = partialmethod(_emit, "note")
    warn = partialmethod(_emit, "warn")
    error = partialmethod(_emit, "error")


def one_line(exc: BaseException) -> str:
    """The most specific line of an exception chain, without Hydra's hints."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [ln.strip() for ln in (str(exc).strip() or type(exc).__name__).splitlines()]
    skip = ("full_key:", "object_type=", "To append to your config", "Set the environment")
    kept = [ln for ln in lines if ln and not ln.startswith(skip)]
    return " ".join(kept or lines)[:400]
