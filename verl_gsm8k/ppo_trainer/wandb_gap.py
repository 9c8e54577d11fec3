"""wandb through a stop: every step the metrics file has reaches wandb, if not in the launch
that trained it then in the next.

A SIGTERM to every process of a launch (Slurm's requeue, a preemption) ends wandb's service
process (``wandb-core`` unblocks the signal that verl's processes keep blocked, docs/slurm.md):
what it had not written is lost (offline, its run file is written in 32 KiB blocks: every step
since its last block, measured in tests/test_wandb_gap.py), and the trainer's next wandb call
fails (``ConnectionResetError``) though the step is saved and in the metrics file. So:

- ``AckedWandb`` stands in for verl's ``Tracking.logger["wandb"]`` (the wandb module, whose
  ``log`` and ``finish`` ``Tracking`` calls; ``verl/utils/tracking.py``). A call that fails
  because the service is gone is said in one line and ends wandb for this launch (the trainer
  goes on to save and stop; the file logger, first in ``Tracking``, has the step). Only a
  ``finish`` that returns, when wandb has written everything, moves RUN_DIR/wandb_logged_step
  to the last step logged.
- ``send_missing``: each launch, before it logs anything, sends its own wandb run the steps after
  that one up to the step it resumes, from the run's metrics files (the first launch with wandb
  starts the count at its own step). verl starts a new wandb run per launch, so they land in the
  relaunch's run, before its own steps; online, where the killed launch's run may hold some of
  them already, they are in both runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from verl_gsm8k.common.run_dir import logged_rows, read_wandb_step, write_wandb_step
from verl_gsm8k.guard import say


class AckedWandb:
    """verl's wandb backend; the last step wandb finished with kept in the run directory."""

    def __init__(self, wandb: Any, run_dir: Path) -> None:
        self.wandb, self.run_dir = wandb, run_dir
        self.gone = False  # the service ended: nothing more goes to wandb in this launch
        self.last: int | None = None  # the last step logged in this launch

    def log(self, data: dict[str, Any], step: int) -> None:
        if self.gone:
            return
        try:
            self.wandb.log(data=data, step=step)
        except ConnectionError as error:  # the service's socket: reset, refused, broken
            self._lost(error, f"step {step} is in the metrics file, not in wandb")
            return
        self.last = step if self.last is None else max(self.last, step)

    def finish(self, exit_code: int = 0) -> None:
        if self.gone:
            return
        try:
            self.wandb.finish(exit_code=exit_code)
        except ConnectionError as error:
            self._lost(error, "this launch's steps may be missing from wandb")
            return
        if self.last is not None:
            write_wandb_step(self.run_dir, self.last)

    def _lost(self, error: ConnectionError, what: str) -> None:
        self.gone = True
        say(f"wandb: its service process ended ({type(error).__name__}: {error}): {what}; the "
            "next launch of this run sends wandb the steps since the last launch that finished "
            "wandb")  # fmt: skip


def _loggable(row: dict[str, Any]) -> dict[str, Any]:
    """What wandb takes of a metrics-file row: numbers (a NaN written as null is left out)."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not (
        isinstance(v, float) and math.isnan(v))}  # fmt: skip


def send_missing(backend: AckedWandb, run_dir: Path, upto: int) -> list[int]:
    """Send wandb the steps after the last one a launch finished wandb with, up to ``upto`` (the
    step this launch resumes), from the run's metrics files; the steps sent."""
    last = read_wandb_step(run_dir)
    if last is None:  # the run's first launch with wandb: the count starts here
        write_wandb_step(run_dir, upto)
        return []
    rows = {step: row for step, row in logged_rows(run_dir).items() if last < step <= upto}
    for step in sorted(rows):
        backend.log(_loggable(rows[step]), step)
    sent = sorted(rows)
    if sent:
        say(f"wandb: {len(sent)} step(s) of earlier launches, {sent[0]} to {sent[-1]}, are in the "
            "metrics files but wandb did not finish writing them (its service ended): sent to "
            "this launch's wandb run")  # fmt: skip
    return sent
