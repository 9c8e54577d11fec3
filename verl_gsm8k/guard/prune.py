"""MAX_CKPT_TO_KEEP over the whole run directory (verl's forgets earlier launches' steps): the
newest N kept, and the tracked step and the best."""

import shutil
from pathlib import Path

from verl_gsm8k.common import run_dir as rd


def protected(run_dir: Path) -> dict[int, str]:
    keep: dict[int, str] = {}
    try:
        best = rd.read_best(run_dir)
    except rd.BestError:
        best = None
    if best is not None:
        keep[best["step"]] = f"the best {best['metric']} ({best['value']:.4g}, {rd.BEST_FILE})"
    tracked = rd.tracked_step(run_dir)
    if tracked is not None:
        keep[tracked] = f"{rd.TRACKER} names it"
    return keep


def prune(run_dir: Path, keep: int, say_kept: bool = True) -> list[str]:
    """Remove all but the newest ``keep`` and the protected steps; a line for each."""
    if keep <= 0:
        return []
    for leftover in rd.removing_leftovers(run_dir):  # a kill mid-removal: a re-saved step's would
        shutil.rmtree(leftover, ignore_errors=True)  # be renamed onto it
    steps, said = rd.saved_steps(run_dir), []
    guard = protected(run_dir)
    for step in steps[:-keep]:
        folder = rd.step_dir(run_dir, step)
        if step in guard:
            said += [f"MAX_CKPT_TO_KEEP={keep}: keeping {folder}: {guard[step]}"] * say_kept
            continue
        said.append(f"MAX_CKPT_TO_KEEP={keep}: removing {folder}")
        doomed = rd.removing_dir(run_dir, step)  # renamed first: never half a checkpoint's name
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return said
