"""The checkpoint a merge reads, found and checked before anything loads it: a run directory's
tracked step (or, with ``--best``, the step its best_checkpoint.json names), a step directory, or
a role directory (``actor/``, ``critic/``, or an SFT step directory holding its one model), each
shard checked before anything loads it (common/checkpoint_files.py). The names:
common/run_dir.py.

Used by the merge (merge/checkpoint.py) and by the launcher's verification of the checkpoint a
relaunch resumes (verl_gsm8k/resume/verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from verl_gsm8k.common.checkpoint_files import ShardError, check_file
from verl_gsm8k.common.run_dir import (
    BEST_FILE,
    FSDP_CONFIG,
    ROLES,
    STEP_N,
    TRACKER,
    BestError,
    FsdpConfigError,
    best_path,
    read_best,
    read_fsdp_config,
    read_stamp,
    read_world_size,
    saved_steps,
    shard_name,
    step_dir,
    step_name,
    step_of,
    tracked_step,
    tracker_path,
)

SFT = "sft"  # the role of an SFT trainer's checkpoint: one causal LM in its step directory itself
DESCRIBED = {"actor": "actor", "critic": "critic", SFT: "SFT model"}


class CheckpointError(Exception):
    """A missing or partial input: one line for the user, exit 2, nothing written."""


@dataclass
class Checkpoint:
    role_dir: Path  # <step directory>/<role>, or the step directory itself for an SFT checkpoint
    role: str  # actor, critic or sft
    step: int | None
    run_dir: Path | None
    fsdp_version: int | None
    world_size: int


def _step_dir_from_run(run_dir: Path) -> Path:
    tracker = tracker_path(run_dir)
    if not tracker.is_file():
        steps = [step_name(step) for step in saved_steps(run_dir)]
        if steps:
            raise CheckpointError(
                f"no {TRACKER} in {run_dir} (found {', '.join(steps)}; the last save may not have "
                f"finished: pass one {STEP_N} directory to merge it anyway)"
            )
        raise CheckpointError(f"no checkpoint in {run_dir}: no {TRACKER} and no {STEP_N}")
    step = tracked_step(run_dir)
    if step is None:
        text = tracker.read_text(encoding="utf-8", errors="replace").strip()
        raise CheckpointError(f"{tracker} does not hold a step number (it holds {text[:40]!r})")
    folder = step_dir(run_dir, step)
    if not folder.is_dir():
        raise CheckpointError(f"{tracker} names step {step} but {folder} is missing")
    return folder


def best_step_dir(run_dir: Path) -> tuple[Path, dict]:
    """``--best``: the step directory a run's best_checkpoint.json names (KEEP_BEST=1, written by
    the guarded trainer: verl_gsm8k/common/run_dir.py), and that record."""
    if not run_dir.exists():
        raise CheckpointError(f"source not found: {run_dir}")
    if not run_dir.is_dir() or step_of(run_dir) is not None or run_dir.name in ROLES:
        raise CheckpointError(f"--best takes a run directory (it reads its {BEST_FILE}): {run_dir}")
    try:
        best = read_best(run_dir)
    except BestError as err:
        raise CheckpointError(str(err)) from None
    if best is None:
        raise CheckpointError(
            f"no {BEST_FILE} in {run_dir}: this run kept no best checkpoint (KEEP_BEST=1 keeps one "
            f"from its first validation on); merge a step with RUN_DIR/{STEP_N}"
        )
    path = step_dir(run_dir, best["step"])
    if not path.is_dir():
        raise CheckpointError(
            f"{best_path(run_dir)} names step {best['step']} but {path} is missing"
        )
    saved_by, scored_by = read_stamp(run_dir, best["step"]), best.get("launch")
    if scored_by and saved_by and saved_by != scored_by:  # unstamped: cannot tell
        raise CheckpointError(
            f"{best_path(run_dir)} names step {best['step']} as validated by launch {scored_by}, "
            f"but {path} was saved by launch {saved_by}: its weights are not the "
            f"ones that scored; merge a step with RUN_DIR/{STEP_N}"
        )
    return path, best


def _holds_shards(path: Path) -> bool:
    return (path / FSDP_CONFIG).exists() or any(path.glob(shard_name("model", "*", "*")))


def _sft_checkpoint(folder: Path, critic: bool) -> tuple[Path, str]:
    if critic:
        raise CheckpointError(
            f"--critic given but {folder} is an SFT checkpoint (one model, no critic)"
        )
    return folder, SFT


def resolve_source(source: Path, critic: bool) -> tuple[Path, str]:
    """The directory holding the shards that SOURCE designates (<step directory>/<role>, or the
    step directory itself for an SFT checkpoint), and the role (actor, critic or sft)."""
    wanted = "critic" if critic else "actor"
    if not source.exists():
        raise CheckpointError(f"source not found: {source}")
    if not source.is_dir():
        raise CheckpointError(f"source is not a directory: {source}")
    is_role_dir = _holds_shards(source)
    if is_role_dir and step_of(source) is not None:  # a step directory with the shards in it
        return _sft_checkpoint(source, critic)
    if is_role_dir or (source.name in ROLES and step_of(source.parent) is not None):
        role = source.name if source.name in ROLES else wanted
        if critic and role == "actor":
            raise CheckpointError(f"--critic given but {source} is an actor checkpoint")
        return source, role
    folder = source if step_of(source) is not None else _step_dir_from_run(source)
    if _holds_shards(folder) and not (folder / wanted).is_dir():
        return _sft_checkpoint(folder, critic)
    role_dir = folder / wanted
    if not role_dir.is_dir():
        hint = " (GRPO runs have no critic)" if critic else ""
        raise CheckpointError(f"no {wanted}/ directory in {folder}{hint}")
    return role_dir, wanted


def check_checkpoint(role_dir: Path, role: str) -> Checkpoint:
    """Everything verl's merger reads must be there; CheckpointError names the first gap."""
    config_path = role_dir / FSDP_CONFIG
    if not config_path.is_file():
        raise CheckpointError(f"missing fsdp_config.json in {role_dir}")
    try:
        world_size = read_world_size(role_dir)
    except FsdpConfigError as err:
        raise CheckpointError(str(err)) from None
    shards = [role_dir / shard_name("model", world_size, rank) for rank in range(world_size)]
    missing = [shard.name for shard in shards if not shard.is_file() or shard.stat().st_size == 0]
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise CheckpointError(
            f"missing rank shard {shown} in {role_dir} (fsdp_config.json says world_size "
            f"{world_size})"
        )
    try:  # before anything loads them: of any world size, as verl's merger takes their count
        for shard in sorted(role_dir.glob(shard_name("model", "*", "*"))):  # from rank 0's mesh
            check_file(shard)
    except ShardError as err:
        raise CheckpointError(str(err)) from None
    hf_dir = role_dir / "huggingface"
    if not hf_dir.is_dir():
        raise CheckpointError(f"missing huggingface/ directory (config, tokenizer) in {role_dir}")
    if not (hf_dir / "config.json").is_file():
        raise CheckpointError(f"missing huggingface/config.json in {role_dir}")
    folder = role_dir if role == SFT else role_dir.parent
    step = step_of(folder)
    run_dir = folder.parent if step is not None else None
    version = read_fsdp_config(role_dir).get("FSDP_version")
    return Checkpoint(
        role_dir=role_dir,
        role=role,
        step=step,
        run_dir=run_dir,
        fsdp_version=int(version) if isinstance(version, int) else None,
        world_size=world_size,
    )
