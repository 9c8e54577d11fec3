"""How long a SIGTERM leaves the trainer to save the step in flight: STOP_GRACE_S, chosen from
the steps and saves measured in the run directory, and said in one line at each launch.

A SIGTERM (Slurm, Kubernetes, ``ray job stop``, a spot instance's notice) makes the launcher write
a stop request; the trainer finishes the step in flight, saves it and stops. At worst the signal
lands as a step begins: that step, its validation, its save, then verl's shutdown. The launcher
stops verl STOP_GRACE_S after the signal, saved or not, so a grace shorter than that loses the
step. Its default, 30 s, is Kubernetes' and Slurm's usual wait before SIGKILL; a 0.5B PPO step on
one GPU alone takes about a minute (docs/slurm.md, "The rule for a GPU run").

So, at each PPO launch (verl_gsm8k/launch/), from ``RUN_DIR/timings.json`` (guard/deadline.py):
  STOP_GRACE_S unset, something measured   the grace is what a stop needs, if over 30 s;
  STOP_GRACE_S set                         kept, with a warning when a stop needs more;
  a Ray job's entrypoint                   ``ray job stop`` sends SIGKILL RAY_JOB_STOP_WAIT_TIME_S
                                           after its SIGTERM (3 s unless the head was started with
                                           it set): a warning when that is shorter.
The chosen grace is standard output's last line (the launcher reads it), after the line saying
it; a warning goes to standard error.
Under Slurm the launcher still gives a stop until 5 s before the job's end (request_stop), and the
trainer stops itself before the end (guard/deadline.py). Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from verl_gsm8k.common.run_dir import TIMINGS_FILE
from verl_gsm8k.guard.deadline import MARGIN_S, Timings

DEFAULT_S = 30.0
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for an entrypoint
RAY_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
# ray/dashboard/modules/job/job_supervisor.py, DEFAULT_RAY_JOB_STOP_WAIT_TIME_S (Ray 2.60)
RAY_WAIT_DEFAULT_S = 3.0


def stop_needs(timings: Timings) -> float | None:
    """Seconds from a SIGTERM to the end of verl after the stop's save, at worst: a whole step,
    its validation and save, and ``MARGIN_S`` for the shutdown. None before any step measured."""
    save = timings.save_or_step()
    if timings.step_s is None or save is None:
        return None
    return timings.step_s + (timings.val_s or 0.0) + save + MARGIN_S


def _measured(timings: Timings, needs: float) -> str:
    save = timings.save_or_step() or 0.0
    val = f", validation {timings.val_s:.0f} s" if timings.val_s else ""
    return (f"{needs:.0f} s: step {timings.step_s:.0f} s{val}, save {save:.0f} s, "
            f"+{MARGIN_S:.0f} s, measured in {TIMINGS_FILE}")  # fmt: skip


def seconds(env: Mapping[str, str], key: str) -> float | None:
    """``env[key]`` as seconds, None when unset; ValueError naming the key when not a number."""
    value = env.get(key, "")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"recipe: {key}={value!r} is not a number of seconds") from None


def choose(timings: Timings, env: Mapping[str, str]) -> tuple[float, list[str]]:
    """(STOP_GRACE_S for this launch, the lines to say) from the run directory's measured
    ``timings``; ValueError on a setting not a number."""
    needs = stop_needs(timings)
    said: list[str] = []
    given = seconds(env, "STOP_GRACE_S")
    if given is not None:
        grace = given
        if needs is not None and grace < needs:
            said.append(
                f"recipe: warning: STOP_GRACE_S={grace:.0f} s is shorter than a stop needs here "
                f"({_measured(timings, needs)}): a SIGTERM would end verl before it saves the "
                f"step in flight; unset STOP_GRACE_S to have it chosen, or raise it"
            )
    elif needs is not None and needs > DEFAULT_S:
        grace = float(math.ceil(needs))
        said.append(f"recipe: STOP_GRACE_S={grace:.0f} s, what a stop needs here "
                    f"({_measured(timings, needs)}); set STOP_GRACE_S to choose")  # fmt: skip
    else:
        grace = DEFAULT_S
        why = (f"a stop needs {_measured(timings, needs)}" if needs is not None
               else "nothing measured in this run directory yet")  # fmt: skip
        said.append(f"recipe: STOP_GRACE_S={grace:.0f} s (the default; {why})")
    if env.get(RAY_JOB_ENV):
        wait = seconds(env, RAY_WAIT_ENV) or RAY_WAIT_DEFAULT_S
        wanted = max(grace, needs or 0.0)
        if wait < wanted:
            said.append(
                f"recipe: warning: a Ray job: `ray job stop` sends SIGKILL {RAY_WAIT_ENV}="
                f"{wait:.0f} s after its SIGTERM, before the step in flight is saved ({wanted:.0f}"
                f" s wanted): start the Ray head with {RAY_WAIT_ENV}={math.ceil(wanted)} in its "
                "environment (docs/scaling.md)"
            )
    return grace, said
