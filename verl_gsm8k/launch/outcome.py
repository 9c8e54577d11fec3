"""How a launch ended: 4 the watchdog stopped it, 5 a stop ended it, else verl's status, with one
line for a refused checkpoint file or a full disk."""

import re
import shutil
from pathlib import Path

from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.guard.stop import JOB_END, read_request


def verdict(run_dir: Path, stamp: str, status: int, signalled: bool = False) -> tuple[int, list]:
    """(exit status, lines for stderr) once verl exited with ``status``."""
    trips = [t for t in rd.read_trips(run_dir) if t.get("launch") == stamp]
    stops = [t for t in trips if t.get("action") == "stop"]
    if stops:
        last = stops[-1]
        return rd.EXIT_WATCHDOG, [f"recipe: {last.get('message')} (WATCHDOG=stop: step "
                               f"{last.get('step')} was not saved; the run stopped)"]  # fmt: skip
    lines = []
    if trips:  # a warning-only rule warns under WATCHDOG=stop too
        lines.append(f"recipe: the watchdog warned {len(trips)} time(s), the run went on; first: "
                     f"{trips[0].get('message')} (all: {rd.watchdog_path(run_dir)})")  # fmt: skip
    stop = read_request(run_dir)
    if stop is not None and status != 143 and (signalled or stop[1] == JOB_END):
        how = "before the job's end" if stop[1] == JOB_END else "on SIGTERM"
        step = rd.tracked_step(run_dir)
        where = f"step {step}" if step is not None else "the start (no checkpoint yet)"
        again = "the same command resumes from"
        said = f"before this launch saved a step; {again} {where}"
        if step is not None and rd.read_stamp(run_dir, step) == stamp:
            said = f"after saving {where} ({rd.step_dir(run_dir, step)}); {again} it"
        lines.append(f"recipe: stopped {how} {said}")
        return rd.EXIT_PREEMPTED, lines
    if status != 0:
        log = log_tail(run_dir, stamp)
        said = refused_load(log) or disk_full(run_dir, log)
        lines += [said] if said else []
    return status, lines


def failed_groups(run_dir: Path, stamp: str) -> str | None:
    """The prompt groups verl's V1 agent loop failed: it logs each (agent_loop_tq.py:137, 145),
    pads the group and trains on (replay_buffer.py:112)."""
    path, uids, other = rd.console_log_path(run_dir, stamp), set(), 0
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:  # the regex only where it can hit: a long run's log is large
                found = "_run_prompt" in line and re.search(
                    r"Error in _run_prompt( for uid=(\S+))?", line
                )
                if found and found.group(2):
                    uids.add(found.group(2))  # one line per failed response of the group
                elif found:
                    other += 1
    except OSError:
        return None
    if not uids and not other:
        return None
    return (f"recipe: verl's agent loop failed {len(uids) + other} prompt group(s) ('Error in "
            f"_run_prompt' in {path}): the trainer padded them and trained on without their "
            "responses")  # fmt: skip


def log_tail(run_dir: Path, stamp: str) -> str:
    try:
        with open(rd.console_log_path(run_dir, stamp), "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - 2_000_000))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def refused_load(log: str) -> str | None:
    """A checkpoint file verl_plugins/checked_load.py refused."""
    found = re.search(r"checked load: (.+)", log)
    if found is None:
        return None
    return (f"recipe: verl stopped at its checkpoint load: {found.group(1).strip()}; nothing was "
            "loaded from that file. Replace the file from a copy you trust, or resume from another "
            "checkpoint (trainer.resume_mode / the tracker; docs/reliability.md)")  # fmt: skip


# A save into a full disk: torch's zip writer, the C++ stream under it, or Python's own
DISK_FULL_SIGNS = ("No space left on device", "unexpected pos ", "basic_ios::clear", "Errno 28")


def _size(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def disk_full(run_dir: Path, log: str) -> str | None:
    """A save into a full disk: the error in the log, or less free than a checkpoint."""
    if not run_dir.is_dir():
        return None
    free, whole = shutil.disk_usage(run_dir).free, rd.tracked_step(run_dir)
    files = rd.step_dir(run_dir, whole).rglob("*") if whole is not None else []
    need = sum(f.stat().st_size for f in files if f.is_file()) if whole is not None else None
    if not (need is not None and free < need or any(s in log for s in DISK_FULL_SIGNS)):
        return None
    newer = [s for s in rd.saved_steps(run_dir) if whole is None or s > whole]
    during = f"the save of step {newer[-1]}" if newer else "a save"
    last, takes = "none yet (the run starts over)", ""
    if need is not None:
        last = f"{rd.step_name(whole)}, which the tracker names"
        takes = f"; one takes {_size(need)}"
    return (f"recipe: the disk holding {run_dir} is full ({_size(free)} free): {during} failed; "
            f"the last whole checkpoint is {last}{takes}: free space (or lower MAX_CKPT_TO_KEEP), "
            "then the same command resumes")  # fmt: skip
