"""A run that must end by a known time (a Slurm job's time limit): stop, saved, before a step that
would not finish in time.

The launcher (verl_gsm8k/launch/) writes the job's end time to ``RUN_DIR/job_deadline`` (epoch
seconds; under Slurm, from ``SLURM_JOB_END_TIME`` or ``squeue -o %e``). The recipes' trainer
(``ppo_trainer/guard_base.py``) measures its own steps and saves as it runs and, after each step,
asks ``must_stop``: would one more step and a save still end before the deadline, less a margin? If
not, it saves the step just trained and stops; the launcher exits 5, and a requeued job resumes.

The slowest step and save measured are kept in ``RUN_DIR/timings.json`` (with the start-up: the
launch to its first step), so that the next launch knows them before its first step: the
launcher refuses a job whose time left cannot hold start-up + one step + a save
(``python -m verl_gsm8k.guard.deadline RUN_DIR --end EPOCH``). Standard library only.

From the end of step N's update to the end of step N+1's save verl may run step N's save and its
validation, then step N+1 and its save: the estimate is the slowest step, validation and save
measured, the save counted twice. Before the first save of a run its time is taken to be a step's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from verl_gsm8k.common import json_read
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import (
    STAMP_FORMAT,
    TIMINGS_FILE,
    deadline_path,
    deadline_stop_path,
    timings_path,
)

MARGIN_S = 15.0  # the trainer's stop and verl's shutdown after the last save


def read_deadline(run_dir: Path) -> float | None:
    try:
        return float(deadline_path(run_dir).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def stamp_time(stamp: str | None) -> float | None:
    """The epoch seconds of a launch stamp (20261126T101500Z)."""
    try:
        return datetime.strptime(stamp or "", STAMP_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


@dataclass
class Timings:
    step_s: float | None = None  # the slowest step interval measured
    save_s: float | None = None  # the slowest save measured
    val_s: float | None = None  # the slowest validation measured
    start_s: float | None = None  # a launch's start to its first step's end (the slowest seen)

    @classmethod
    def read(cls, run_dir: Path) -> Timings:
        try:
            data = json_read.read(timings_path(run_dir), max_bytes=1 << 20)
        except (OSError, json_read.JsonError):
            return cls()
        if not isinstance(data, dict):
            return cls()
        known = {
            k: float(v) for k, v in data.items() if k in ("step_s", "save_s", "val_s", "start_s")
        }
        return cls(**known)

    def write(self, run_dir: Path) -> None:
        data = {k: round(v, 3) for k, v in vars(self).items() if v is not None}
        write_atomic(timings_path(run_dir), json.dumps(data) + "\n")

    def slowest(self, name: str, seconds: float) -> None:
        old = getattr(self, name)
        setattr(self, name, seconds if old is None else max(old, seconds))

    def save_or_step(self) -> float | None:
        """The slowest save measured; before the run's first save, a step's time stands in."""
        return self.save_s if self.save_s is not None else self.step_s

    def next_step_and_save(self) -> float | None:
        """From the end of a step's update to the end of the next step's save: this step's save
        and validation (when verl runs them), the next step, its save."""
        save = self.save_or_step()
        if self.step_s is None or save is None:
            return None
        return self.step_s + 2 * save + (self.val_s or 0.0)


def must_stop(now: float, deadline: float | None, timings: Timings) -> bool:
    """True when one more step and its save would not end ``MARGIN_S`` before the deadline."""
    needed = timings.next_step_and_save()
    return deadline is not None and needed is not None and now + needed + MARGIN_S > deadline


def record_stop(
    run_dir: Path, step: int, stamp: str | None, deadline: float, needed: float
) -> None:
    data = {"step": step, "launch": stamp, "deadline": deadline, "needed_s": round(needed, 1)}
    write_atomic(deadline_stop_path(run_dir), json.dumps(data) + "\n")


def read_stop(run_dir: Path) -> dict | None:
    try:
        data = json_read.read(deadline_stop_path(run_dir), max_bytes=1 << 20)
    except (OSError, json_read.JsonError):
        return None
    return data if isinstance(data, dict) else None


def plan(run_dir: Path, end: float, now: float) -> tuple[int, str]:
    """(status, line) of a launch whose job ends at ``end``: 2 when the measured start-up, a step
    and a save cannot fit in the time left."""
    left = end - now
    timings = Timings.read(run_dir)
    needed = timings.next_step_and_save()
    when = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if needed is None or timings.start_s is None:
        return 0, (
            f"deadline: the job ends at {when} ({left:.0f} s left): the trainer measures its steps "
            "and saves, then saves and stops before a step that would not end in time "
            f"({MARGIN_S:.0f} s margin); nothing measured in this run directory yet"
        )
    total = timings.start_s + needed + MARGIN_S
    measured = (
        f"measured here: start-up {timings.start_s:.0f} s, step {timings.step_s:.0f} s, save "
        f"{timings.save_or_step():.1f} s"
    )
    if left < total:
        return 2, (
            f"deadline: the job ends at {when}, {left:.0f} s from now: shorter than start-up + "
            f"one step + a save + {MARGIN_S:.0f} s ({total:.0f} s, {measured}); nothing would be "
            "saved: ask for more time (sbatch --time)"
        )
    return 0, (
        f"deadline: the job ends at {when} ({left:.0f} s left): the trainer saves and stops "
        f"before a step that would not end in time ({measured}, from {TIMINGS_FILE})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.guard.deadline",
        description="Write a launch's deadline into its run directory and say whether start-up, "
        "one step and a save fit before it (verl_gsm8k/launch/, under Slurm).",
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (RUN_DIR)")
    parser.add_argument("--end", type=float, required=True, help="the job's end, epoch seconds")
    args = parser.parse_args(argv)
    return plan_and_write(args.run_dir, args.end)


def plan_and_write(run_dir: Path, end: float) -> int:
    """Say whether start-up, a step and a save fit before ``end``; when they do, write it as the
    trainer's deadline. The status: 0, or 2 when they do not fit."""
    status, line = plan(run_dir, end, time.time())
    print(f"recipe: {line}", file=sys.stderr if status else sys.stdout, flush=True)
    if status == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(deadline_path(run_dir), f"{end:.0f}\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
