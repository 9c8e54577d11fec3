"""Before a relaunch: the checkpoint verl resumes (its tracker's, trainer_base.py ~850) is whole,
each file loaded by the function verl's loads run; else the newest whole one before it; none:
exit 2."""

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.common.checkpoint_files import ShardError, load
from verl_gsm8k.merge.find import CheckpointError, check_checkpoint

# verl's checkpoint.load_contents (default: save_contents) -> the shards it loads beside the model
LOADED = {"optimizer": "optim", "extra": "extra_state"}
Loads = Mapping[str, Sequence[str]]  # role -> verl's load_contents of that role


class NoWholeCheckpoint(Exception):
    """Checkpoints exist, none of them whole: the launch stops."""


def problem(folder: Path, roles: tuple[str, ...], loads: Loads | None = None) -> str | None:
    """Why verl could not (or must not) resume from ``folder``, or None."""
    if (folder / rd.SICK_FILE).exists():
        return f"the watchdog marked it sick ({folder / rd.SICK_FILE}): kept, never resumed"
    try:
        for role in roles:
            if not (folder / role).is_dir():
                return f"no {role}/ in {folder}"
            ckpt = check_checkpoint(folder / role, role)  # its model shards, fsdp_config, HF
            contents = None if loads is None else loads.get(role)
            kinds = rd.SHARD_KINDS[1:] if contents is None else [LOADED[c] for c in contents
                                                               if c in LOADED]  # fmt: skip
            for kind in kinds:
                for rank in range(ckpt.world_size):
                    shard = folder / role / rd.shard_name(kind, ckpt.world_size, rank)
                    if not os.path.lexists(shard):  # a link, a FIFO: load says
                        return f"missing {shard.name} in {folder / role}"
                    load(shard, mmap=True)
        data = folder / "data.pt"
        if not os.path.lexists(data):
            return f"missing data.pt (the dataloader's position) in {folder}"
        load(data)
    except (CheckpointError, ShardError) as err:
        return str(err)
    return None


def track(run_dir: Path, step: int) -> None:
    """Point the tracker at ``step`` (atomically), unless it names it already."""
    if rd.tracked_step(run_dir) != step:
        rd.write_tracker(run_dir, step)


def resume_point(run_dir: Path, roles: tuple[str, ...], *, write: bool = True,
                 loads: Loads | None = None) -> tuple[int | None, list[str]]:  # fmt: skip
    """The step a relaunch resumes (None: from scratch) and the lines to say, the tracker rewritten
    where it must change (write=False: left to ``track``). NoWholeCheckpoint when none is whole."""
    steps = rd.saved_steps(run_dir) if run_dir.is_dir() else []
    if not steps:
        return None, []
    tracked, said = rd.tracked_step(run_dir), []
    if tracked in steps:
        why = problem(rd.step_dir(run_dir, tracked), roles, loads)
        if why is None:
            return tracked, [f"resume: {rd.step_name(tracked)} is whole (every shard checked)"]
        said.append(f"resume: {rd.step_name(tracked)}, which {rd.TRACKER} names, is not whole: "
                    f"{why}")  # fmt: skip
        steps = [s for s in steps if s < tracked]
    else:
        state = "is missing" if not rd.tracker_path(run_dir).exists() else "names no step here"
        said.append(f"resume: {rd.TRACKER} {state} (verl would train from scratch); looking for "
                    "the newest whole checkpoint")  # fmt: skip
    for step in reversed(steps):
        why = problem(rd.step_dir(run_dir, step), roles, loads)
        if why is None:
            if write:
                track(run_dir, step)
            said.append(f"resume: from {rd.step_name(step)} instead ({rd.TRACKER} now names it)")
            return step, said
        said.append(f"resume: {rd.step_name(step)} is not whole either: {why}")
    raise NoWholeCheckpoint(
        f"resume: no whole checkpoint in {run_dir} ({', '.join(said)}); nothing was deleted: "
        "RESUME=disable starts over in this directory, a new EXPERIMENT_NAME in a new one"
    )
