"""How a launch (PPO or SFT) ended, as the launcher says it and exits with it.

``verdict``, called by the launcher (launch/cli.py) once verl has exited, gives one line and
the launch's exit status:
``EXIT_WATCHDOG`` (4) when the watchdog stopped this launch (the line: the metric, its value and
threshold, the step, the last healthy checkpoint); ``EXIT_PREEMPTED`` (5) after SIGTERM
(``stopped``; the line: the step saved, or that none was and where a relaunch resumes) or
before a job's end (``guard/deadline.py``: the step saved); verl's
own status otherwise. Warn-mode trips of the launch are counted in a line. Standard library only.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from verl_gsm8k.common.run_dir import (
    EXIT_PREEMPTED,
    EXIT_WATCHDOG,
    console_log_path,
    read_stamp,
    read_trips,
    saved_steps,
    step_dir,
    step_name,
    tracked_step,
    watchdog_path,
)
from verl_gsm8k.guard.deadline import read_stop


def verdict(run_dir: Path, stamp: str, verl_status: int, stopped: bool) -> tuple[int, list[str]]:
    """(exit status, lines to print on stderr)."""
    trips = [t for t in read_trips(run_dir) if t.get("launch") == stamp]
    stops = [t for t in trips if t.get("action") == "stop"]
    lines = []
    if stops:
        last = stops[-1]
        lines.append(
            f"recipe: {last.get('message')} (WATCHDOG=stop: step {last.get('step')} was not "
            "saved; the run stopped)"
        )
        return EXIT_WATCHDOG, lines
    if trips:
        # not "WATCHDOG=warn": a warning-only rule (critic_divergence, one skipped update) warns
        # under WATCHDOG=stop too
        lines.append(
            f"recipe: the watchdog warned {len(trips)} time(s), the run went on; first: "
            f"{trips[0].get('message')} (all: {watchdog_path(run_dir)})"
        )
    deadline = read_stop(run_dir)
    if deadline is not None and deadline.get("launch") == stamp:
        step = deadline.get("step")
        lines.append(
            f"recipe: stopped before the job's end after saving step {step} (one more step and "
            f"its save take about {deadline.get('needed_s')} s, measured); the same command "
            "resumes from it"
        )
        return EXIT_PREEMPTED, lines
    if stopped:
        step = tracked_step(run_dir)
        if step is not None and read_stamp(run_dir, step) == stamp:
            lines.append(
                f"recipe: stopped on SIGTERM after saving step {step} "
                f"({step_dir(run_dir, step)}); the same command resumes from it"
            )
        else:
            where = f"step {step}" if step is not None else "the start (no checkpoint yet)"
            lines.append(
                f"recipe: stopped on SIGTERM before this launch saved a step; the same command "
                f"resumes from {where}"
            )
        return EXIT_PREEMPTED, lines
    if verl_status != 0:
        log = log_tail(run_dir, stamp)
        said = refused_load(log) or disk_full(run_dir, log)
        if said:
            lines.append(said)
    return verl_status, lines


def log_tail(run_dir: Path, stamp: str, size: int = 2_000_000) -> str:
    """The last ``size`` bytes of the launch's console log ("" when there is none)."""
    log = console_log_path(run_dir, stamp)
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, log.stat().st_size - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# verl_plugins/checked_load.py: a checkpoint file refused in the process that was loading it
# (its ShardError travels through Ray's traceback into the console log).
REFUSED = re.compile(r"checked load: (.+)")


def refused_load(log: str) -> str | None:
    """The one line for a launch whose checkpoint load refused a file (None: not that)."""
    found = REFUSED.search(log)
    if found is None:
        return None
    return (
        f"recipe: verl stopped at its checkpoint load: {found.group(1).strip()}; nothing was "
        "loaded from that file. Replace the file from a copy you trust, or resume from another "
        "checkpoint (trainer.resume_mode / the tracker; docs/resume.md)"
    )


# What a save into a full disk leaves in verl's console log: torch's zip writer ("unexpected pos
# 9984 vs 9878"), the C++ stream under it ("basic_ios::clear: iostream error"), or Python's own.
DISK_FULL_SIGNS = ("No space left on device", "unexpected pos ", "basic_ios::clear", "Errno 28")


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n / 2**10:.0f} KiB"


def disk_full(run_dir: Path, text: str) -> str | None:
    """The one line for a launch that died saving into a full disk (None: not that): which disk,
    which step's save, the last whole checkpoint, and what one checkpoint needs. Told by the
    error in the console log ``text`` or, since a full disk may cut that log short, by less free
    space than the last whole checkpoint takes."""
    free = shutil.disk_usage(run_dir).free if run_dir.is_dir() else None
    whole = tracked_step(run_dir)
    need = _bytes(step_dir(run_dir, whole)) if whole is not None else None
    short = free is not None and need is not None and free < need
    if free is None or not (short or any(sign in text for sign in DISK_FULL_SIGNS)):
        return None
    newer = [s for s in saved_steps(run_dir) if whole is None or s > whole]
    during = f"the save of step {newer[-1]}" if newer else "a save"
    if whole is None or need is None:
        last, takes = "none yet (the run starts over)", ""
    else:
        last, takes = f"{step_name(whole)}, which the tracker names", f"; one takes {_size(need)}"
    return (
        f"recipe: the disk holding {run_dir} is full ({_size(free)} free): {during} failed; the "
        f"last whole checkpoint is {last}{takes}: free space (or lower MAX_CKPT_TO_KEEP), then "
        "the same command resumes"
    )
