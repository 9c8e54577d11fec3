"""Write a text file atomically: a temporary file beside it, flushed, then renamed over it.

A reader sees the old file or the new one, never half of one, and a failure leaves the old one.
Standard library only: used by the run report (verl_gsm8k/report/cli.py, .venv) and the evaluation
(verl_gsm8k/evaluate/cli.py, verl_gsm8k/evaluate/run.py; .venv-eval).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
