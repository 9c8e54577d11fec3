"""Checkpoints a run will write: saved in a form a resume finds, and room for them on the disk.

* ``checkpoint.async_save`` is implemented for Megatron only (verl 0.9.1,
  verl/trainer/config/config.py:37). With FSDP the shards are written synchronously anyway, but
  the v1 trainer then skips writing its tracker (trainer_base.py ~1012; the run directory's names:
  common/run_dir.py), so a relaunch never finds the checkpoint and trains from scratch: an error.
* Size of one checkpoint, measured on the CPU runs of this repository (a step directory of
  learn_tiny.sh): the FSDP model shard holds fp32 weights (4 bytes a parameter), the optimizer
  shard Adam's two fp32 moments of each trained parameter (8 bytes); the actor and the critic
  each write both, the reference nothing. A run keeps ``trainer.max_actor_ckpt_to_keep`` of
  them (all of them when unset; the recipes' trainer one more while it saves, and the kept
  best), and the filesystem of ``trainer.default_local_dir`` must hold
  them: less free space than that is an error, less than twice that a warning.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from verl_gsm8k.common.run_dir import TRACKER
from verl_gsm8k.preflight.lines import Report
from verl_gsm8k.preflight.memory import lora_parameters
from verl_gsm8k.preflight.model import count_parameters

GIB = 1024**3
WEIGHT_BYTES = 4  # fp32 shard of the FSDP model
ADAM_BYTES = 8  # exp_avg + exp_avg_sq, fp32


def check_async_save(cfg: Any, report: Report) -> None:
    for role, block in (("actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        if not (block.get("checkpoint") or {}).get("async_save", False):
            continue
        strategy = str(block.get("strategy", "fsdp"))
        if strategy.startswith("fsdp"):
            report.error(
                "checkpoint",
                f"{role}.checkpoint.async_save=true with strategy {strategy}: verl 0.9.1 saves "
                "asynchronously only under Megatron, and with it skips writing "
                f"{TRACKER}, so a relaunch would train from scratch; "
                f"set {role}.checkpoint.async_save=false",
            )


def checkpoint_bytes(cfg: Any, hf_configs: dict[str, Any]) -> int:
    """Bytes of one step directory of this config (actor, and critic when it has one)."""
    total = 0
    for role, hf_config in hf_configs.items():
        model = cfg.actor_rollout_ref.model if role == "actor" else cfg.critic.model
        params = count_parameters(hf_config)
        rank = int(model.get("lora_rank", 0) or 0)
        trained = lora_parameters(hf_config, rank, model.get("target_modules")) if rank else params
        total += params * WEIGHT_BYTES + trained * (ADAM_BYTES + WEIGHT_BYTES * (rank > 0))
    return total


def guarded(cfg: Any) -> bool:
    """The recipes' trainer runs (verl_gsm8k/guard/): the v1 trainer in mode gsm8k."""
    v1 = cfg.trainer.get("v1") or {}
    return bool(cfg.trainer.get("use_v1", True)) and v1.get("trainer_mode") == "gsm8k"


def kept_checkpoints(cfg: Any) -> int | None:
    """How many step directories the run holds at most; None when it cannot be told. The recipes'
    trainer prunes after each save (never before: the newest whole checkpoint stays until the
    next is whole), so it holds one more for a moment, and the kept best beside them."""
    keep = cfg.trainer.get("max_actor_ckpt_to_keep")
    if keep is not None and int(keep) > 0:
        if not guarded(cfg):
            return int(keep)
        return int(keep) + 1 + int(keeps_best(cfg))
    steps, freq = cfg.trainer.get("total_training_steps"), int(cfg.trainer.get("save_freq", -1))
    if steps is None or freq <= 0:
        return None
    # MAX_CKPT_TO_KEEP=0 keeps every save, and the best steps saved between them
    return max(1, int(steps) // freq) + int(keeps_best(cfg))


def existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def keeps_best(cfg: Any) -> bool:
    return guarded(cfg) and bool((cfg.get("gsm8k_guard") or {}).get("keep_best", False))


def check_disk(cfg: Any, hf_configs: dict[str, Any], report: Report) -> None:
    saves = int(cfg.trainer.get("save_freq", -1)) > 0
    if not saves and not keeps_best(cfg):
        report.ok("checkpoint", "trainer.save_freq <= 0: this run writes no checkpoint")
        return
    one = checkpoint_bytes(cfg, hf_configs)
    # no save step: the kept best alone (each new best replaces the last: one, and the next
    # for a moment); otherwise the kept ones
    kept = kept_checkpoints(cfg) if saves else 2
    run_dir = Path(str(cfg.trainer.default_local_dir))
    free = shutil.disk_usage(existing_parent(run_dir)).free
    size = f"{one / GIB:.2f} GiB a checkpoint (fp32 weights + Adam states of each trained role)"
    if kept is None:
        report.warn(
            "checkpoint",
            f"{size}; the number kept is not bounded (trainer.max_actor_ckpt_to_keep unset and "
            f"no total_training_steps): {free / GIB:.1f} GiB free at {run_dir}",
        )
        return
    need = one * kept
    line = f"{size} x {kept} kept = {need / GIB:.2f} GiB; {free / GIB:.1f} GiB free at {run_dir}"
    if free < need:
        report.error("checkpoint", f"{line}: the disk fills before the run ends (MAX_CKPT_TO_KEEP)")
    elif free < 2 * need:
        report.warn("checkpoint", f"{line}: less than twice what the run needs")
    else:
        report.ok("checkpoint", line)
