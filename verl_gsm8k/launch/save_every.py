"""How often the trainer saves by the clock (SAVE_EVERY_MIN), besides every SAVE_FREQ steps: the
bound on what a SIGKILL loses (a node lost, the out-of-memory killer, a spot instance reclaimed
without notice: no handler runs, and everything since the last checkpoint is gone).

The trainer (ppo_trainer/guard_base.py) saves after the first step that ends SAVE_EVERY_MIN or more
after its last save (or after its start); these checkpoints are like any other (pruning, the kept
best, the resume). ``auto`` picks the interval from the run's own slowest save measured in
``RUN_DIR/timings.json`` (guard/deadline.py) so that time saves cost at most ``SHARE`` of the
run's time; before any save was measured, ``FIRST_MIN``. Said in one line at each launch.
Standard library only.
"""

from __future__ import annotations

from pathlib import Path

from verl_gsm8k.common.run_dir import TIMINGS_FILE
from verl_gsm8k.guard.deadline import Timings

SHARE = 0.03  # time saves take at most this share of the run: one save per save_s / SHARE
FIRST_MIN = 20.0  # a first launch, no save measured yet: its own saves set the next launch's
MIN_MIN = 1.0  # never more often than each minute (a CPU's tiny model saves in well under 1 s)


def choose(run_dir: Path, value: str) -> tuple[float, str]:
    """(minutes between time saves, 0 for none; the line to say) for SAVE_EVERY_MIN=value."""
    if value != "auto":
        minutes = float(value)
        if minutes <= 0:
            return (
                0.0,
                "recipe: no time saves (SAVE_EVERY_MIN=0): a SIGKILL loses every step "
                "since the last SAVE_FREQ save",
            )
        return (
            minutes,
            f"recipe: a time save after the first step past each {minutes:g} min (SAVE_EVERY_MIN)",
        )
    save = Timings.read(run_dir).save_s
    if save is None:
        return (
            FIRST_MIN,
            f"recipe: a time save after the first step past each {FIRST_MIN:g} min "
            f"(SAVE_EVERY_MIN=auto: no save measured yet in {TIMINGS_FILE})",
        )
    minutes = round(max(MIN_MIN, save / SHARE / 60.0), 1)
    return (
        minutes,
        f"recipe: a time save after the first step past each {minutes:g} min "
        f"(SAVE_EVERY_MIN=auto: a save takes {save:.0f} s here, {TIMINGS_FILE}: at most "
        f"{SHARE:.0%} of the run)",
    )
