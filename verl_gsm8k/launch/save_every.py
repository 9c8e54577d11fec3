"""SAVE_EVERY_MIN: a time save after the first step past that many minutes; ``auto``: 3 % of the
run from the slowest save measured (20 min before any)."""

from pathlib import Path

from verl_gsm8k.common.run_dir import TIMINGS_FILE
from verl_gsm8k.guard.stop import Timings

SHARE, FIRST_MIN, MIN_MIN = 0.03, 20.0, 1.0


def choose(run_dir: Path, value: str) -> tuple[float, str]:
    save = Timings.read(run_dir).save_s if value == "auto" else None
    if value != "auto":
        minutes, why = float(value), "SAVE_EVERY_MIN"
    elif save is None:
        minutes, why = FIRST_MIN, f"SAVE_EVERY_MIN=auto: no save measured yet in {TIMINGS_FILE}"
    else:
        minutes = round(max(MIN_MIN, save / SHARE / 60.0), 1)
        why = (f"SAVE_EVERY_MIN=auto: a save takes {save:.0f} s here, {TIMINGS_FILE}: at most "
               f"{SHARE:.0%} of the run")  # fmt: skip
    if minutes <= 0:
        return 0.0, ("recipe: no time saves (SAVE_EVERY_MIN=0): a SIGKILL loses every step since "
                     "the last SAVE_FREQ save")  # fmt: skip
    return minutes, f"recipe: a time save after the first step past each {minutes:g} min ({why})"
