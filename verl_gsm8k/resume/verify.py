"""Before a relaunch resumes: the checkpoint verl will load is whole, or an earlier whole one is.

verl 0.9.1 resumes from the step its tracker names (trainer_base.py ~850,
``find_latest_ckpt_path``; the names: common/run_dir.py) and stops with a traceback when one of
its files is truncated (a job killed mid-save); with the tracker missing or empty it trains from
scratch without a word.
Before verl starts, every file verl loads from that step is checked (each rank's model, optim and
extra_state shard, the Hugging Face config, data.pt: present, each zip record's CRC intact, and
each pickle naming only globals a verl checkpoint holds: common/checkpoint_files.py, whose checked
load verl's own loaders then run, verl_plugins/checked_load.py).
When the named step is not whole, the newest whole step before it is named instead (the tracker
rewritten atomically, one line said); a missing or empty tracker is written for the newest whole
step. No whole step at all is one line and exit 2: nothing is deleted, the damaged steps stay for
inspection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from verl_gsm8k.common.checkpoint_files import ShardError, check_file
from verl_gsm8k.common.run_dir import (
    SHARD_KINDS,
    SICK_FILE,
    TRACKER,
    saved_steps,
    shard_name,
    step_dir,
    step_name,
    tracked_step,
    tracker_path,
    write_tracker,
)
from verl_gsm8k.merge.find import CheckpointError, check_checkpoint

# verl's ``checkpoint.load_contents`` (default: its ``save_contents``) -> the shards it loads
# besides the model's: a run saved with save_contents=[model,extra] writes no optimizer shard and
# resumes without one.
LOADED = {"optimizer": "optim", "extra": "extra_state"}
Loads = Mapping[str, Sequence[str]]  # role -> verl's load_contents of that role


def loaded_kinds(contents: Sequence[str] | None) -> tuple[str, ...]:
    """The shard kinds besides the model's that verl loads for a role (None: all of them)."""
    if contents is None:
        return SHARD_KINDS[1:]
    return tuple(kind for name, kind in LOADED.items() if name in contents)


class NoWholeCheckpoint(Exception):
    """Checkpoints exist, none of them whole: the launch stops."""


def problem(step_dir: Path, roles: tuple[str, ...], loads: Loads | None = None) -> str | None:
    """Why verl could not (or must not) resume from STEP_DIR, or None when every file it loads is
    whole and the watchdog did not mark it sick."""
    if (step_dir / SICK_FILE).exists():
        return f"the watchdog marked it sick ({step_dir / SICK_FILE}): kept, never resumed"
    try:
        for role in roles:
            role_dir = step_dir / role
            if not role_dir.is_dir():
                return f"no {role}/ in {step_dir}"
            ckpt = check_checkpoint(role_dir, role)  # model shards (CRC), fsdp_config, huggingface/
            for kind in loaded_kinds(None if loads is None else loads.get(role)):
                for rank in range(ckpt.world_size):
                    shard = role_dir / shard_name(kind, ckpt.world_size, rank)
                    if not shard.is_file():
                        return f"missing {shard.name} in {role_dir}"
                    check_file(shard)
        data = step_dir / "data.pt"
        if not data.is_file():
            return f"missing data.pt (the dataloader's position) in {step_dir}"
        check_file(data)
    except (CheckpointError, ShardError) as err:
        return str(err)
    return None


def track(run_dir: Path, step: int) -> None:
    """Point the tracker at ``step`` (atomically), unless it names it already."""
    if tracked_step(run_dir) != step:
        write_tracker(run_dir, step)


def resume_point(
    run_dir: Path, roles: tuple[str, ...], *, write: bool = True, loads: Loads | None = None
) -> tuple[int | None, list[str]]:
    """The step a relaunch resumes from (None: no checkpoint, training starts from scratch) and
    the lines to say; the tracker is rewritten when it must change (``write=False``: left as it
    is, for ``track`` to point once the launch may go on). NoWholeCheckpoint when there are
    checkpoints and none is whole."""
    if not run_dir.is_dir():
        return None, []
    steps = saved_steps(run_dir)
    if not steps:
        return None, []
    tracked = tracked_step(run_dir)
    said: list[str] = []
    if tracked is not None and tracked in steps:
        why = problem(step_dir(run_dir, tracked), roles, loads)
        name = step_name(tracked)
        if why is None:
            return tracked, [f"resume: {name} is whole (every shard checked)"]
        said.append(f"resume: {name}, which {TRACKER} names, is not whole: {why}")
        candidates = [s for s in steps if s < tracked]
    else:
        state = "is missing" if not tracker_path(run_dir).exists() else "names no step here"
        said.append(
            f"resume: {TRACKER} {state} (verl would train from scratch); looking for the newest "
            "whole checkpoint"
        )
        candidates = steps
    for step in reversed(candidates):
        why = problem(step_dir(run_dir, step), roles, loads)
        if why is None:
            if write:
                track(run_dir, step)
            said.append(f"resume: from {step_name(step)} instead ({TRACKER} now names it)")
            return step, said
        said.append(f"resume: {step_name(step)} is not whole either: {why}")
    raise NoWholeCheckpoint(
        f"resume: no whole checkpoint in {run_dir} ({', '.join(said)}); nothing was deleted: "
        "RESUME=disable starts over in this directory, a new EXPERIMENT_NAME in a new one"
    )
