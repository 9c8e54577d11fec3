"""What the guarded trainer leaves in a run directory, and how every other stage reads it.

    RUN_DIR/global_step_N/launch_stamp.txt   the UTC stamp of the launch that saved step N (the
                                             stamp of RUN_DIR/launches/launch-<stamp>.yaml)
    RUN_DIR/best_checkpoint.json             the kept best checkpoint (KEEP_BEST=1):
        {"format": 1, "step": 40, "metric": "val-core/openai/gsm8k/acc/mean@1", "value": 0.57,
         "launch": "20261125T101500Z"}
    RUN_DIR/watchdog.jsonl                   one line per watchdog trip (WATCHDOG=stop|warn):
        {"launch": STAMP, "step": 12, "rule": "non_finite", "metric": "actor/pg_loss",
         "value": NaN, "threshold": "not finite", "action": "stop", "last_healthy_checkpoint": 10,
         "message": "the one line the launcher prints"}
    RUN_DIR/stop_requested                   written by the launcher on SIGTERM (the deadline, in
                                             seconds since the epoch); the trainer saves and stops
    RUN_DIR/global_step_N/watchdog_sick.json the watchdog's trip that judged step N's weights sick
                                             (they generated the sick step N+1): kept for a look,
                                             never resumed, never the best; a re-save of step N
                                             removes it

Standard library only: the report, merge and evaluation read these in their own environments.
Every write is atomic (a temporary file, then a rename) except the watchdog log, which is appended
one whole line at a time.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic

STAMP_FILE = "launch_stamp.txt"
BEST_FILE = "best_checkpoint.json"
WATCHDOG_FILE = "watchdog.jsonl"
STOP_FILE = "stop_requested"
SICK_FILE = "watchdog_sick.json"
BEST_FORMAT = 1

# The launcher's exit statuses (verl_gsm8k/launch/): a run the watchdog stopped, a run stopped on
# SIGTERM after saving. Both resume with the same command.
EXIT_WATCHDOG = 4
EXIT_PREEMPTED = 5


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"global_step_{step}"


def write_stamp(run_dir: Path, step: int, stamp: str) -> None:
    write_atomic(step_dir(run_dir, step) / STAMP_FILE, stamp + "\n")


def read_stamp(run_dir: Path, step: int) -> str | None:
    """The stamp of the launch that saved ``step``; None for a checkpoint saved without one."""
    try:
        text = (step_dir(run_dir, step) / STAMP_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def write_best(run_dir: Path, step: int, metric: str, value: float, launch: str | None) -> None:
    best = {"format": BEST_FORMAT, "step": step, "metric": metric, "value": value, "launch": launch}
    write_atomic(Path(run_dir) / BEST_FILE, json.dumps(best, indent=1) + "\n")


class BestError(Exception):
    """best_checkpoint.json exists and cannot be read: one line for the user."""


def read_best(run_dir: Path) -> dict[str, Any] | None:
    """The kept best checkpoint's record; None when the run keeps none."""
    path = Path(run_dir) / BEST_FILE
    if not path.is_file():
        return None
    try:
        best = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BestError(f"{path}: not readable JSON ({err})") from None
    step = best.get("step") if isinstance(best, dict) else None
    value = best.get("value") if isinstance(best, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(value, (int, float)):
        raise BestError(f"{path}: no integer 'step' and numeric 'value'")
    return best


def mark_sick(run_dir: Path, step: int, trip: dict[str, Any]) -> None:
    write_atomic(step_dir(run_dir, step) / SICK_FILE, json.dumps(trip) + "\n")


def is_sick(run_dir: Path, step: int) -> bool:
    return (step_dir(run_dir, step) / SICK_FILE).exists()


def clear_sick(run_dir: Path, step: int) -> None:
    (step_dir(run_dir, step) / SICK_FILE).unlink(missing_ok=True)


def drop_best(run_dir: Path) -> None:
    (Path(run_dir) / BEST_FILE).unlink(missing_ok=True)


def append_trip(run_dir: Path, trip: dict[str, Any]) -> None:
    path = Path(run_dir) / WATCHDOG_FILE
    line = json.dumps(trip) + "\n"  # NaN and Infinity stay as JSON's NaN/Infinity tokens
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_trips(run_dir: Path) -> list[dict[str, Any]]:
    """Every watchdog trip of the run, oldest first; an unreadable line is skipped."""
    path = Path(run_dir) / WATCHDOG_FILE
    if not path.is_file():
        return []
    trips = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            trip = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill mid-append
        if isinstance(trip, dict) and isinstance(trip.get("step"), int):
            trips.append(trip)
    return trips


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
