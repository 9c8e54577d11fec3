"""Where a run writes: its directory can be made, a resume finds its checkpoints, the disk holds
the ones it keeps."""

import os
import shutil
from pathlib import Path
from typing import Any

from verl_gsm8k.common.run_dir import TRACKER
from verl_gsm8k.preflight.device import lora_rank
from verl_gsm8k.preflight.lines import Report
from verl_gsm8k.preflight.memory import GIB, lora_parameters
from verl_gsm8k.preflight.model import count_parameters

WEIGHT_BYTES, ADAM_BYTES = 4, 8


def check_run_dir(cfg: Any, report: Report) -> Path | None:
    """The run directory can be made; its nearest existing folder."""
    parent = Path(str(cfg.trainer.default_local_dir))
    try:
        while not parent.exists():
            parent = parent.parent
    except OSError as err:  # a name longer than the filesystem allows
        problem = err.strerror
    else:
        writable = os.access(parent, os.W_OK | os.X_OK)
        problem = "" if parent.is_dir() and writable else f"{parent} is not a writable directory"
    if problem:
        report.error("run dir", f"trainer.default_local_dir cannot be made: {problem} "
                     "(RUNS_ROOT, EXPERIMENT_NAME)")  # fmt: skip
    return None if problem else parent


def check_async_save(cfg: Any, report: Report) -> None:
    """With FSDP an async save makes the v1 trainer skip its tracker."""
    for role, block in (("actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        strategy = str(block.get("strategy", "fsdp"))
        if (block.get("checkpoint") or {}).get("async_save", False) and strategy.startswith("fsdp"):
            report.error("checkpoint", f"{role}.checkpoint.async_save=true with strategy "
                         f"{strategy}: verl then skips {TRACKER}, so a relaunch trains from "
                         f"scratch; set {role}.checkpoint.async_save=false")  # fmt: skip


def checkpoint_bytes(cfg: Any, hf_configs: dict[str, Any]) -> int:
    """Bytes of one step directory (actor, and critic when it has one)."""
    total = 0
    for role, hf_config in hf_configs.items():
        model = cfg.actor_rollout_ref.model if role == "actor" else cfg.critic.model
        params = count_parameters(hf_config)
        rank = lora_rank(model)
        trained = lora_parameters(hf_config, rank, model.get("target_modules")) if rank else params
        total += params * WEIGHT_BYTES + trained * (ADAM_BYTES + WEIGHT_BYTES * (rank > 0))
    return total


def kept_checkpoints(cfg: Any) -> int | None:
    """Step directories the run holds at most (None: unbounded)."""
    v1 = cfg.trainer.get("v1") or {}
    guarded = cfg.trainer.get("use_v1", True) and v1.get("trainer_mode") == "gsm8k"
    best = int(bool(guarded and (cfg.get("gsm8k_guard") or {}).get("keep_best", False)))
    if int(cfg.trainer.get("save_freq", -1)) <= 0:
        return 2 * best or 0  # the kept best alone: the last one, and the next for a moment
    keep = cfg.trainer.get("max_actor_ckpt_to_keep")
    if keep is not None and int(keep) > 0:
        return int(keep) + (1 + best if guarded else 0)
    steps = cfg.trainer.get("total_training_steps")
    # MAX_CKPT_TO_KEEP=0 keeps every save, and the best steps saved between them
    return None if steps is None else max(1, int(steps) // int(cfg.trainer.save_freq)) + best


def check_disk(cfg: Any, hf_configs: dict[str, Any], where: Path, report: Report) -> None:
    kept = kept_checkpoints(cfg)
    if kept == 0:
        report.ok("checkpoint", "trainer.save_freq <= 0: this run writes no checkpoint")
        return
    one, free = checkpoint_bytes(cfg, hf_configs), shutil.disk_usage(where).free
    size, room = f"{one / GIB:.2f} GiB a checkpoint", f"{free / GIB:.1f} GiB free at {where}"
    if kept is None:
        report.warn("checkpoint", f"{size}, unbounded (no MAX_CKPT_TO_KEEP, no "
                    f"total_training_steps); {room}")  # fmt: skip
        return
    need = one * kept
    line = f"{size} x {kept} kept = {need / GIB:.2f} GiB; {room}"
    if free < need:
        report.error("checkpoint", f"{line}: the disk fills before the run ends (MAX_CKPT_TO_KEEP)")
    elif free < 2 * need:
        report.warn("checkpoint", f"{line}: less than twice what the run needs")
    else:
        report.ok("checkpoint", line)
