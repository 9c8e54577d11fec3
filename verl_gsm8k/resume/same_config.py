"""No silent resume of another experiment: a relaunch is compared, key by key over the resolved
config, with the launch that wrote the checkpoint it resumes (its launch_stamp.txt); a key outside
ALLOWED that differs stops it in one line."""

import json
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from verl_gsm8k.common.config_diff import differing, leaves
from verl_gsm8k.common.launch_record import read_record
from verl_gsm8k.common.run_dir import (
    STEP_GLOB,
    best_path,
    launch_record_path,
    launch_record_paths,
    read_stamp,
    step_dir,
    superseded_dir,
    tracked_step,
    tracker_path,
)

MODES = ("auto", "force", "disable")

# The keys that may change on a resume (fnmatch over dotted keys; "X.*" matches X too), PPO and
# SFT alike; why: docs/reliability.md.
ALLOWED = (
    "trainer.total_epochs", "trainer.total_training_steps",
    "trainer.save_freq", "trainer.max_*ckpt_to_keep", "trainer.resume_mode",
    "trainer.resume_from_path", "trainer.esi_redundant_time", "trainer.default_hdfs_dir",
    "trainer.del_local_ckpt_after_load",
    "trainer.test_freq", "trainer.val_before_train", "trainer.val_only",
    "trainer.log_val_generations", "trainer.logger.*", "trainer.project_name",
    "trainer.experiment_name", "actor_rollout_ref.rollout.trace.*",
    "trainer.default_local_dir", "trainer.rollout_data_dir", "trainer.validation_data_dir",
    "*micro_batch_size*", "*max_token_len_per_gpu", "*use_dynamic_bsz", "*offload*",
    "*.enable_gradient_checkpointing", "*timeout",
    "*.override_config.attn_implementation", "*.use_remove_padding",
    "*.gpu_memory_utilization", "*.enforce_eager", "*.free_cache_engine",
    "*.cudagraph_capture_sizes", "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.max_num_batched_tokens", "actor_rollout_ref.rollout.max_num_seqs",
    "*.profiler.*", "global_profiler.*", "trainer.profile_interval.*",
    "actor_rollout_ref.rollout.prometheus.*",
    "ray_kwargs.*", "trainer.v1.trainer_mode", "gsm8k_trace.*", "gsm8k_guard.*",
)  # fmt: skip
# A PPO checkpoint is resharded for another world size before verl starts; an SFT one is not.
RESHARDED = ("trainer.nnodes", "trainer.n_gpus_per_node", "actor_rollout_ref.rollout.nnodes",
             "actor_rollout_ref.rollout.n_gpus_per_node")  # fmt: skip


def allowed(key: str) -> bool:
    """Whether ``key`` may change on a resume."""
    return any(
        fnmatchcase(key, pattern) or (pattern.endswith(".*") and fnmatchcase(key, pattern[:-2]))
        for pattern in ALLOWED
    )


def _show(flat: dict[str, Any], key: str) -> str:
    if key not in flat:
        return "(absent)"
    return flat[key] if isinstance(flat[key], str) else json.dumps(flat[key])


def differences(previous: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'key old -> new' for each key of two records' configs that differs and may not change."""
    before, after = previous.get("trainer", "ppo"), new.get("trainer", "ppo")
    if before != after:
        return [f"trainer {before} -> {after}"]
    old, now = leaves(previous["config"]), leaves(new["config"])
    return [
        f"{key} {_show(old, key)} -> {_show(now, key)}"
        for key in differing([old, now])
        if not allowed(key) and not (before == "ppo" and key in RESHARDED)
    ]


def latest_checkpoint(run_dir: Path) -> int | None:
    """The step verl would resume (its tracker's, when that directory exists), or None."""
    step = tracked_step(run_dir)
    return step if step is not None and step_dir(run_dir, step).is_dir() else None


def writer(run_dir: Path, step: int) -> dict[str, Any] | None:
    """The record of the launch that saved ``step``, else the last launch's, else None."""
    stamp = read_stamp(run_dir, step)
    if stamp is not None and launch_record_path(run_dir, stamp).is_file():
        return read_record(launch_record_path(run_dir, stamp))
    paths = launch_record_paths(run_dir)
    return read_record(paths[-1]) if paths else None


def refusal(run_dir: Path, step: int | None, new: dict[str, Any], mode: str) -> str | None:
    """The one line that stops a relaunch resuming ``step``, or None when it may go on."""
    previous = writer(run_dir, step) if mode == "auto" and step is not None else None
    diffs = differences(previous, new) if previous else []
    if not diffs:
        return None
    return (
        f"launch: {run_dir} holds the checkpoint of step {step} of another experiment "
        f"({len(diffs)} key(s) differ from launch {previous.get('stamp')}: {'; '.join(diffs)}), "
        "which verl would resume silently: set a new EXPERIMENT_NAME for a new run, or "
        "RESUME=force to continue that checkpoint with the new settings"
    )


def set_aside(run_dir: Path, stamp: str) -> list[str]:
    """RESUME=disable: the earlier run moves to superseded-<stamp>/; the lines to say."""
    moved = [p for p in run_dir.glob(STEP_GLOB) if p.is_dir()] if run_dir.is_dir() else []
    moved += [path for path in (tracker_path(run_dir), best_path(run_dir)) if path.exists()]
    if not moved:
        return []
    aside = superseded_dir(run_dir, stamp)
    aside.mkdir()
    for path in sorted(moved):
        path.rename(aside / path.name)
    steps = len(list(aside.glob(STEP_GLOB)))
    return [
        f"resume: RESUME=disable: the earlier run's {steps} checkpoint(s), tracker and kept "
        f"best moved to {aside} (nothing deleted; merge.sh takes a step there)"
    ]
