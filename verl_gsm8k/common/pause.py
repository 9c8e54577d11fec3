"""A test hook that holds a process at a named point, so that a real kill lands there and nowhere
else (mid-save, mid-prune) instead of racing a timer.

    GSM8K_PAUSE_AT=prune:after_rename GSM8K_PAUSE_FILE=/tmp/here python -m ...

At ``pause_point("prune:after_rename")`` the process writes its pid to GSM8K_PAUSE_FILE (a
temporary file, then a rename: a reader never sees half of it) and sleeps until it is killed, or
until the test deletes GSM8K_PAUSE_FILE (after changing something on disk): then it goes on, and
the point holds no process again (``<file>.released-<point>``). GSM8K_PAUSE_AT may name several
points, comma-separated (``rollout:2,rollout:3``: one launch held at each, through the same file).
Unset (every real run), ``pause_point`` is one dictionary lookup. Standard library only: the
guarded trainer calls it inside verl's workers, pruning from the launcher.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

AT = "GSM8K_PAUSE_AT"
FILE = "GSM8K_PAUSE_FILE"


def pause_point(name: str) -> None:
    """Hold here when GSM8K_PAUSE_AT names this point (tests only): until killed, or until
    GSM8K_PAUSE_FILE is deleted."""
    points = os.environ.get(AT)
    if points is None or name not in points.split(","):
        return
    target = Path(os.environ.get(FILE) or f"/tmp/gsm8k-pause-{os.getpid()}")
    released = target.with_name(f"{target.name}.released-{name.replace(':', '-')}")
    if released.exists():
        return
    partial = target.with_name(f".{target.name}.tmp")
    partial.write_text(f"{os.getpid()}\n", encoding="utf-8")
    os.replace(partial, target)
    while target.exists():
        time.sleep(0.2)
    released.touch()
