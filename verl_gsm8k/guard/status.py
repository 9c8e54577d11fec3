"""How a PPO launch ended, as the launcher says it and exits with it.

    python -m verl_gsm8k.guard.status RUN_DIR --stamp STAMP --verl-status N [--stopped]

Run by recipes/common.sh once verl has exited. It prints one line and exits with:
``EXIT_WATCHDOG`` (4) when the watchdog stopped this launch (the line: the metric, its value and
threshold, the step, the last healthy checkpoint); ``EXIT_PREEMPTED`` (5) after SIGTERM
(``--stopped``; the line: the step saved, or that none was and where a relaunch resumes); verl's
own status otherwise. Warn-mode trips of the launch are counted in a line. Standard library only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from verl_gsm8k.guard.files import (
    EXIT_PREEMPTED,
    EXIT_WATCHDOG,
    WATCHDOG_FILE,
    read_stamp,
    read_trips,
)
from verl_gsm8k.guard.prune import tracked_step


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
        lines.append(
            f"recipe: the watchdog warned {len(trips)} time(s) (WATCHDOG=warn), first: "
            f"{trips[0].get('message')} (all: {run_dir / WATCHDOG_FILE})"
        )
    if stopped:
        step = tracked_step(run_dir)
        if step is not None and read_stamp(run_dir, step) == stamp:
            lines.append(
                f"recipe: stopped on SIGTERM after saving step {step} "
                f"({run_dir / f'global_step_{step}'}); the same command resumes from it"
            )
        else:
            where = f"step {step}" if step is not None else "the start (no checkpoint yet)"
            lines.append(
                f"recipe: stopped on SIGTERM before this launch saved a step; the same command "
                f"resumes from {where}"
            )
        return EXIT_PREEMPTED, lines
    return verl_status, lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.guard.status", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (RUN_DIR)")
    parser.add_argument("--stamp", required=True, help="the launch's UTC stamp")
    parser.add_argument("--verl-status", type=int, required=True, help="verl's exit status")
    parser.add_argument(
        "--stopped", action="store_true", help="the launcher received SIGTERM during the run"
    )
    args = parser.parse_args(argv)
    status, lines = verdict(args.run_dir, args.stamp, args.verl_status, args.stopped)
    for line in lines:
        print(line, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
