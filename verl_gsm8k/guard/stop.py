"""Stopping a run early without losing its step: RUN_DIR/stop_requested ("<deadline> <why>"),
written on a SIGTERM or by the trainer before a job's end; the trainers save the step and exit 5.
A SIGTERM's grace must cover a step, its validation and save as measured; before a known job end
the trainer stops after the last step that fits."""

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from verl_gsm8k.common import json_read
from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.common.atomic_io import write_atomic

MARGIN_S = 15.0  # the trainer's stop and verl's shutdown after the last save
DEFAULT_GRACE_S = 30.0  # Slurm's KillWait and Kubernetes' grace by default
SIGTERM, JOB_END = "sigterm", "job-end"
ENV_JOB_END = "GSM8K_JOB_END"  # the job's end, epoch seconds, for the trainer
NOTHING = "nothing measured in this run directory yet"
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for an entrypoint
RAY_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"  # ray/dashboard/modules/job/job_supervisor.py: 3 s


@dataclass
class Timings:
    step_s: float | None = None
    save_s: float | None = None
    val_s: float | None = None
    start_s: float | None = None  # a launch's start to its first step's end

    @classmethod
    def read(cls, run_dir: Path) -> "Timings":
        try:
            data = json_read.read(rd.timings_path(run_dir), max_bytes=1 << 20)
        except (OSError, json_read.JsonError):
            return cls()
        data, names = data if isinstance(data, dict) else {}, vars(cls())
        return cls(**{k: float(v) for k, v in data.items()  # a number, else not measured
                      if k in names and type(v) in (int, float) and math.isfinite(v)})  # fmt: skip

    def write(self, run_dir: Path) -> None:
        data = {k: round(v, 3) for k, v in vars(self).items() if v is not None}
        write_atomic(rd.timings_path(run_dir), json.dumps(data) + "\n")

    def slowest(self, name: str, seconds: float) -> None:
        setattr(self, name, max(getattr(self, name) or 0.0, seconds))

    def save(self) -> float | None:
        """The slowest save; before the first, a step's time."""
        return self.save_s if self.save_s is not None else self.step_s

    def stop_needs(self) -> float | None:
        """A SIGTERM to verl's end, at worst: a step, its validation and save, a margin."""
        if self.step_s is None:
            return None
        return self.step_s + (self.val_s or 0.0) + (self.save() or 0.0) + MARGIN_S

    def next_step(self) -> float | None:
        """A step's end to the next step saved: this save and validation, a step, a save."""
        if self.step_s is None:
            return None
        return self.step_s + 2 * (self.save() or 0.0) + (self.val_s or 0.0)

    def said(self, needs: float) -> str:
        val = f", validation {self.val_s:.0f} s" if self.val_s else ""
        return (f"{needs:.0f} s: step {self.step_s:.0f} s{val}, save {self.save():.0f} s, "
                f"+{MARGIN_S:.0f} s, measured in {rd.TIMINGS_FILE}")  # fmt: skip


def must_stop(now: float, end: float | None, timings: Timings) -> bool:
    """One more step and its save would not end MARGIN_S before ``end``."""
    needed = timings.next_step()
    return end is not None and needed is not None and now + needed + MARGIN_S > end


def request(run_dir: Path, deadline: float, why: str, over: bool = False) -> bool:
    """Write the stop request (unless ``over``, not over one there); True when written."""
    final = rd.stop_path(run_dir)
    partial = run_dir / f".{rd.STOP_FILE}.{os.getpid()}"
    partial.write_text(f"{deadline:.0f} {why}\n", encoding="utf-8")
    try:
        if over:
            os.replace(partial, final)
        else:
            os.link(partial, final)
        return True
    except FileExistsError:
        return False
    finally:
        partial.unlink(missing_ok=True)


def read_request(run_dir: Path) -> tuple[float, str] | None:
    """(deadline, why) of the stop request; one unreadable asks for a save now."""
    try:
        text = rd.stop_path(run_dir).read_text(encoding="utf-8")
    except OSError:
        return None
    deadline, _, why = text.strip().partition(" ")
    try:
        return float(deadline), why or SIGTERM
    except ValueError:
        return time.time() + 3600, SIGTERM


def fits(run_dir: Path, end: float, now: float) -> tuple[int, str]:
    """(status, line): 2 when the measured start-up, a step and a save cannot end by ``end``."""
    left, t = end - now, Timings.read(run_dir)
    when = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    head = f"recipe: deadline: the job ends at {when}"
    needed = t.next_step()
    if needed is None or t.start_s is None:
        return 0, (f"{head} ({left:.0f} s left): the trainer measures its steps and saves, then "
                   "saves and stops before a step that would not end in time "
                   f"({MARGIN_S:.0f} s margin); {NOTHING}")  # fmt: skip
    total = t.start_s + needed + MARGIN_S
    measured = (f"measured here: start-up {t.start_s:.0f} s, step {t.step_s:.0f} s, save "
                f"{t.save():.1f} s")  # fmt: skip
    if left < total:
        return 2, (f"{head}, {left:.0f} s from now: shorter than start-up + one step + a save + "
                   f"{MARGIN_S:.0f} s ({total:.0f} s, {measured}); nothing would be saved: ask "
                   "for more time (sbatch --time)")  # fmt: skip
    return 0, (f"{head} ({left:.0f} s left): the trainer saves and stops before a step that "
               f"would not end in time ({measured}, from {rd.TIMINGS_FILE})")  # fmt: skip


def seconds(env: Mapping[str, str], key: str) -> float | None:
    value = env.get(key, "")
    try:
        return float(value) if value else None
    except ValueError:
        raise ValueError(f"recipe: {key}={value!r} is not a number of seconds") from None


def grace(timings: Timings, env: Mapping[str, str]) -> tuple[float, list[str]]:
    """(STOP_GRACE_S, lines): the user's, else what a stop needs here if over the default."""
    needs, given = timings.stop_needs(), seconds(env, "STOP_GRACE_S")
    said = []
    if given is not None:
        chosen = given
        if needs is not None and given < needs:
            said.append(f"recipe: warning: STOP_GRACE_S={given:.0f} s is shorter than a stop "
                        f"needs here ({timings.said(needs)}): a SIGTERM would end verl before "
                        "it saves the step in flight; unset STOP_GRACE_S to have it chosen, or "
                        "raise it")  # fmt: skip
    elif needs is not None and needs > DEFAULT_GRACE_S:
        chosen = float(math.ceil(needs))
        said.append(f"recipe: STOP_GRACE_S={chosen:.0f} s, what a stop needs here "
                    f"({timings.said(needs)}); set STOP_GRACE_S to choose")  # fmt: skip
    else:
        chosen = DEFAULT_GRACE_S
        why = f"a stop needs {timings.said(needs)}" if needs else NOTHING
        said.append(f"recipe: STOP_GRACE_S={chosen:.0f} s (the default; {why})")
    wanted = max(chosen, needs or 0.0)
    if env.get(RAY_JOB_ENV) and (wait := seconds(env, RAY_WAIT_ENV) or 3.0) < wanted:
        said.append(f"recipe: warning: a Ray job: `ray job stop` sends SIGKILL {RAY_WAIT_ENV}="
                    f"{wait:.0f} s after its SIGTERM, before the step in flight is saved "
                    f"({wanted:.0f} s wanted): start the Ray head with {RAY_WAIT_ENV}="
                    f"{math.ceil(wanted)} in its environment (docs/scaling.md)")  # fmt: skip
    return chosen, said
