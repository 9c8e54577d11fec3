"""MAX_CKPT_TO_KEEP over the whole run directory, never removing what a resume or a merge needs.

    python -m verl_gsm8k.guard.prune RUN_DIR --keep N

verl's ``max_*_ckpt_to_keep`` prunes only what the current process saved (a resumed launch
forgets the earlier ones) and keeps the highest step numbers. Here the newest N step directories
are kept, plus, whatever their age, the step the tracker names (what a relaunch resumes) and the
kept best (``best_checkpoint.json``); the names: common/run_dir.py. Called by the guarded trainer
after each save (v1 trainer) and by the launcher after a launch that ended cleanly (SFT, the
legacy trainer). Standard library only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from verl_gsm8k.common.pause import pause_point
from verl_gsm8k.common.run_dir import (
    BEST_FILE,
    TRACKER,
    BestError,
    read_best,
    removing_dir,
    removing_leftovers,
    saved_steps,
    step_dir,
    tracked_step,
)


def protected(run_dir: Path) -> dict[int, str]:
    """step -> why it is never pruned."""
    keep: dict[int, str] = {}
    try:
        best = read_best(run_dir)
    except BestError:
        best = None  # unreadable: protect nothing by it (the report says the file is bad)
    if best is not None:
        keep[best["step"]] = f"the best {best['metric']} ({best['value']:.4g}, {BEST_FILE})"
    tracked = tracked_step(run_dir)
    if tracked is not None:
        keep[tracked] = f"{TRACKER} names it"
    return keep


def prune(run_dir: Path, keep: int, say_kept: bool = True) -> list[str]:
    """Remove all but the newest ``keep`` step directories and the protected ones; the lines
    naming each removed (and, with ``say_kept``, each protected old) step directory."""
    if keep <= 0:
        return []
    clear_leftovers(run_dir)
    steps = saved_steps(run_dir)
    newest = set(steps[-keep:])
    guard = protected(run_dir)
    said = []
    for step in steps:
        if step in newest:
            continue
        folder = step_dir(run_dir, step)
        if step in guard:
            if say_kept:
                said.append(f"MAX_CKPT_TO_KEEP={keep}: keeping {folder}: {guard[step]}")
            continue
        said.append(f"MAX_CKPT_TO_KEEP={keep}: removing {folder}")
        # renamed first: a kill mid-removal leaves no half step directory named like a checkpoint
        doomed = removing_dir(run_dir, step)
        folder.rename(doomed)
        pause_point("prune:after_rename")  # tests: a kill lands here (tests/test_guard_files.py)
        shutil.rmtree(doomed, ignore_errors=True)
    return said


def clear_leftovers(run_dir: Path) -> None:
    """Remove what a kill mid-removal left (``removing_dir``): it was being removed, and a later
    removal of a re-saved step K would otherwise rename onto it and fail."""
    for leftover in removing_leftovers(run_dir):
        shutil.rmtree(leftover, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.guard.prune", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (RUN_DIR)")
    parser.add_argument(
        "--keep", type=int, required=True, help="newest checkpoints kept (MAX_CKPT_TO_KEEP; 0: all)"
    )
    args = parser.parse_args(argv)
    for line in prune(args.run_dir, args.keep):
        print(f"recipe: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
