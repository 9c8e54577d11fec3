"""The checkpoint a merge reads (a run's tracked step, --best's step, a step or role directory, an
SFT step directory), found and checked before anything loads it; also the resume's check of each
role."""

import os
from dataclasses import dataclass
from pathlib import Path

from verl_gsm8k.common import json_read
from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.common.checkpoint_files import ShardError, load

SFT = "sft"  # the role of an SFT trainer's checkpoint: one causal LM in its step directory
DESCRIBED = {"actor": "actor", "critic": "critic", SFT: "SFT model"}


class CheckpointError(Exception):
    """A missing, partial or refused input: one line, exit 2, nothing written."""


@dataclass
class Checkpoint:
    role_dir: Path  # <step directory>/<role>, or the step directory itself for an SFT checkpoint
    role: str  # actor, critic or sft
    step: int | None
    run_dir: Path | None
    fsdp_version: int | None
    world_size: int


def _step_dir_from_run(run_dir: Path) -> Path:
    tracker = rd.tracker_path(run_dir)
    if not tracker.is_file():
        steps = ", ".join(rd.step_name(step) for step in rd.saved_steps(run_dir))
        if steps:
            raise CheckpointError(f"no {rd.TRACKER} in {run_dir} (found {steps}; the last save "
                                  f"may not have finished: pass one {rd.STEP_N} directory to "
                                  "merge it anyway)")  # fmt: skip
        raise CheckpointError(f"no checkpoint in {run_dir}: no {rd.TRACKER} and no {rd.STEP_N}")
    step = rd.tracked_step(run_dir)
    if step is None:
        text = tracker.read_text(encoding="utf-8", errors="replace").strip()
        raise CheckpointError(f"{tracker} does not hold a step number (it holds {text[:40]!r})")
    folder = rd.step_dir(run_dir, step)
    if not folder.is_dir():
        raise CheckpointError(f"{tracker} names step {step} but {folder} is missing")
    return folder


def best_step_dir(run_dir: Path) -> tuple[Path, dict]:
    """``--best``: the step directory a run's best_checkpoint.json names, and that record."""
    if not run_dir.exists():
        raise CheckpointError(f"source not found: {run_dir}")
    if not run_dir.is_dir() or rd.step_of(run_dir) is not None or run_dir.name in rd.ROLES:
        raise CheckpointError(f"--best takes a run directory (it reads its {rd.BEST_FILE}): "
                              f"{run_dir}")  # fmt: skip
    try:
        best = rd.read_best(run_dir)
    except rd.BestError as err:
        raise CheckpointError(str(err)) from None
    if best is None:
        raise CheckpointError(f"no {rd.BEST_FILE} in {run_dir}: this run kept no best checkpoint "
                              "(KEEP_BEST=1 keeps one from its first validation on); merge a step "
                              f"with RUN_DIR/{rd.STEP_N}")  # fmt: skip
    path = rd.step_dir(run_dir, best["step"])
    named = f"{rd.best_path(run_dir)} names step {best['step']}"
    if not path.is_dir():
        raise CheckpointError(f"{named} but {path} is missing")
    saved_by, scored_by = rd.read_stamp(run_dir, best["step"]), best.get("launch")
    if scored_by and saved_by and saved_by != scored_by:  # unstamped: cannot tell
        raise CheckpointError(f"{named} as validated by launch {scored_by}, but {path} was "
                              f"saved by launch {saved_by}: its weights are not the ones that "
                              f"scored; merge a step with RUN_DIR/{rd.STEP_N}")  # fmt: skip
    return path, best


def _holds_shards(path: Path) -> bool:
    return (path / rd.FSDP_CONFIG).exists() or any(path.glob(rd.shard_name("model", "*", "*")))


def _sft(folder: Path, critic: bool) -> tuple[Path, str]:
    if critic:
        raise CheckpointError(f"--critic given but {folder} is an SFT checkpoint (one model, no "
                              "critic)")  # fmt: skip
    return folder, SFT


def resolve_source(source: Path, critic: bool) -> tuple[Path, str]:
    """The directory holding the shards SOURCE designates, and its role (actor, critic, sft)."""
    wanted = "critic" if critic else "actor"
    if not source.exists():
        raise CheckpointError(f"source not found: {source}")
    if not source.is_dir():
        raise CheckpointError(f"source is not a directory: {source}")
    is_role_dir = _holds_shards(source)
    if is_role_dir and rd.step_of(source) is not None:  # a step directory with the shards in it
        return _sft(source, critic)
    if is_role_dir or (source.name in rd.ROLES and rd.step_of(source.parent) is not None):
        role = source.name if source.name in rd.ROLES else wanted
        if critic and role == "actor":
            raise CheckpointError(f"--critic given but {source} is an actor checkpoint")
        return source, role
    folder = source if rd.step_of(source) is not None else _step_dir_from_run(source)
    if _holds_shards(folder) and not (folder / wanted).is_dir():
        return _sft(folder, critic)
    if not (folder / wanted).is_dir():
        hint = " (GRPO runs have no critic)" if critic else ""
        raise CheckpointError(f"no {wanted}/ directory in {folder}{hint}")
    return folder / wanted, wanted


def check_checkpoint(role_dir: Path, role: str) -> Checkpoint:
    """What verl's merger reads, loaded by the one loading policy; CheckpointError names the first
    gap."""
    try:
        world, config = rd.read_world_size(role_dir), rd.read_fsdp_config(role_dir)
    except rd.FsdpConfigError as err:
        raise CheckpointError(str(err)) from None
    names = [rd.shard_name("model", world, rank) for rank in range(world)]
    missing = [n for n in names if not os.path.lexists(role_dir / n)]  # a link: load says
    if missing:
        raise CheckpointError(f"missing rank shard {missing[0]} in {role_dir} ({len(missing)} of "
                              f"the {world} its {rd.FSDP_CONFIG} names)")  # fmt: skip
    hf_dir = role_dir / "huggingface"
    if not (hf_dir / "config.json").is_file():
        raise CheckpointError(f"missing huggingface/config.json (and tokenizer) in {role_dir}")
    try:
        for name in names:
            load(role_dir / name, mmap=True)
        for path in sorted([*role_dir.glob("*.json"), *hf_dir.glob("*.json")]):
            json_read.read(path)
    except (ShardError, json_read.JsonError, OSError) as err:
        raise CheckpointError(str(err)) from None
    folder = role_dir if role == SFT else role_dir.parent
    step = rd.step_of(folder)
    version = config.get("FSDP_version")
    return Checkpoint(role_dir, role, step, folder.parent if step is not None else None,
                      version if isinstance(version, int) else None, world)  # fmt: skip
