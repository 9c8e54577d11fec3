"""No silent resume of another experiment: a relaunch into a run directory that holds a checkpoint
must be the same experiment as the launch that WROTE that checkpoint.

verl resumes whatever checkpoint sits in ``trainer.default_local_dir`` (``resume_mode: auto``),
so after a change of model, batch size, reward function or learning rate, a relaunch under the
same ``EXPERIMENT_NAME`` would continue the old weights without a word. The launch that saved
step N is named by the ``launch_stamp.txt`` of its step directory (written by the recipes'
trainer, ``verl_gsm8k/guard/``; the names: common/run_dir.py); its record
``RUN_DIR/launches/launch-<stamp>.yaml`` is compared with the new launch's, leaf by leaf over the
resolved configs. Every key differs the experiment except the few of ``ALLOWED`` (bookkeeping,
logging, speed and memory); a difference stops the launch with one line naming each key, old ->
new. Resuming the same config stays automatic. ``RESUME=force``
resumes anyway, ``RESUME=disable`` starts over (verl's ``trainer.resume_mode=disable``), a new
``EXPERIMENT_NAME`` starts a new run directory.
"""

from __future__ import annotations

import json
import math
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

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

# The keys that may change on a resume (fnmatch patterns over dotted keys; "X.*" also matches X
# itself). Every other key of the resolved config is compared. The same list serves main_ppo's
# config and the SFT trainer's (model.*, optim.*, data.*, engine.*, trainer.*).
ALLOWED = (
    # how long the run goes on; with a cosine or warm-up schedule the rest of it stretches to fit
    "trainer.total_epochs", "trainer.total_training_steps",
    # checkpoints: how often, how many kept, where verl resumes from, deadline saves
    "trainer.save_freq", "trainer.max_*ckpt_to_keep", "trainer.resume_mode",
    "trainer.resume_from_path", "trainer.esi_redundant_time", "trainer.default_hdfs_dir",
    "trainer.del_local_ckpt_after_load",
    # validation and logging: measured how often and where to, under which names
    "trainer.test_freq", "trainer.val_before_train", "trainer.val_only",
    "trainer.log_val_generations", "trainer.logger.*", "trainer.project_name",
    "trainer.experiment_name", "actor_rollout_ref.rollout.trace.*",
    # the run directory itself (this comparison runs in it) and the dumps written under it
    "trainer.default_local_dir", "trainer.rollout_data_dir", "trainer.validation_data_dir",
    # speed and memory only: micro-batches, token budgets, offloading, recomputation, timeouts
    "*micro_batch_size*", "*max_token_len_per_gpu", "*use_dynamic_bsz", "*offload*",
    "*.enable_gradient_checkpointing", "*timeout",
    # the attention kernel the launcher picks per host (flash-attention or sdpa: the same math)
    "*.override_config.attn_implementation", "*.use_remove_padding",
    # the rollout engine's memory and speed (vLLM; its weights come from the actor every step)
    "*.gpu_memory_utilization", "*.enforce_eager", "*.free_cache_engine",
    "*.cudagraph_capture_sizes", "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.max_num_batched_tokens", "actor_rollout_ref.rollout.max_num_seqs",
    # profilers and monitoring
    "*.profiler.*", "global_profiler.*", "trainer.profile_interval.*",
    "actor_rollout_ref.rollout.prometheus.*",
    # the launcher's own: Ray's start-up (per-launch environment on a cluster), the recipes'
    # trainer, the token trace and the guard's watchdog and keep-best settings
    "ray_kwargs.*", "trainer.v1.trainer_mode", "gsm8k_trace.*", "gsm8k_guard.*",
)  # fmt: skip
# A PPO run's world size may change too: the launch rewrites the checkpoint's shards for the new
# one before verl starts (verl 0.9.1's FSDPCheckpointManager.load_checkpoint, utils/checkpoint/
# fsdp_checkpoint_manager.py ~213, opens only model_world_size_<W>_rank_<r>.pt of its own W:
# verl_gsm8k/reshard/), and with it the rollout's copy of it. An SFT run's may not (its checkpoint
# is not resharded).
RESHARDED = ("trainer.nnodes", "trainer.n_gpus_per_node", "actor_rollout_ref.rollout.nnodes",
             "actor_rollout_ref.rollout.n_gpus_per_node")  # fmt: skip


def allowed(key: str) -> bool:
    """Whether ``key`` may change on a resume."""
    return any(
        fnmatchcase(key, pattern) or (pattern.endswith(".*") and fnmatchcase(key, pattern[:-2]))
        for pattern in ALLOWED
    )


def leaves(node: dict[str, Any] | list[Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": [1, 2]}} -> {"a.b.0": 1, "a.b.1": 2}; an empty mapping or list holds nothing."""
    flat: dict[str, Any] = {}
    for key, value in node.items() if isinstance(node, dict) else enumerate(node):
        if isinstance(value, (dict, list)):
            flat.update(leaves(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # a value left unresolved, as written: "1e-6"
        except ValueError:
            return None
    return None


def same(a: Any, b: Any) -> bool:
    """Equal settings: numbers as numbers (1e-6 == 0.000001 == "1e-6", 1 == 1.0), True apart
    from 1."""
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        return x == y or (math.isnan(x) and math.isnan(y))
    return type(a) is type(b) and a == b


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


ABSENT = "(absent)"


def differences(previous: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'key old -> new' for each key of the resolved configs that differs and may not change."""
    before, after = previous.get("trainer", "ppo"), new.get("trainer", "ppo")
    if before != after:
        return [f"trainer {before} -> {after}"]
    old, now = leaves(previous["config"]), leaves(new["config"])
    out = []
    for key in [*old, *(k for k in now if k not in old)]:
        if allowed(key) or (before == "ppo" and key in RESHARDED):
            continue
        if key in old and key in now and same(old[key], now[key]):
            continue
        was = _show(old[key]) if key in old else ABSENT
        becomes = _show(now[key]) if key in now else ABSENT
        out.append(f"{key} {was} -> {becomes}")
    return out


def latest_checkpoint(run_dir: Path) -> int | None:
    """The step verl would resume from (the one its tracker names, when it exists), or None."""
    step = tracked_step(run_dir)
    return step if step is not None and step_dir(run_dir, step).is_dir() else None


def writer(run_dir: Path, step: int) -> dict[str, Any] | None:
    """The record of the launch that saved ``step``; None when the run has no record at all.
    (Only that record is read: a long run relaunched often holds many.)"""
    stamp = read_stamp(run_dir, step)
    if stamp is not None and launch_record_path(run_dir, stamp).is_file():
        return read_record(launch_record_path(run_dir, stamp))
    # A checkpoint saved without a stamp (before the recipes' trainer wrote one), or whose
    # launch left no record: the last launch is the best guess of who wrote it.
    paths = launch_record_paths(run_dir)
    return read_record(paths[-1]) if paths else None


def refusal(run_dir: Path, step: int | None, new: dict[str, Any], mode: str) -> str | None:
    """The one line that stops a relaunch resuming ``step`` (None: no checkpoint), or None when
    it may go on."""
    if mode != "auto" or step is None:
        return None
    previous = writer(run_dir, step)
    if previous is None:
        return None
    diffs = differences(previous, new)
    if not diffs:
        return None
    return (
        f"launch: {run_dir} holds the checkpoint of step {step} of another experiment "
        f"({len(diffs)} key(s) differ from launch {previous.get('stamp')}: {'; '.join(diffs)}), "
        "which verl would resume silently: set a new EXPERIMENT_NAME for a new run, or "
        "RESUME=force to continue that checkpoint with the new settings"
    )


def set_aside(run_dir: Path, stamp: str) -> list[str]:
    """RESUME=disable in a directory that holds an earlier run: its checkpoints, tracker and kept
    best move to ``superseded-<stamp>/`` (nothing deleted; each step there still merges), so that
    the new run's steps 1, 2, ... are not pruned as older than the old run's higher ones, nor
    measured against the old run's best. The lines to say."""
    moved = [p for p in run_dir.glob(STEP_GLOB) if p.is_dir()] if run_dir.is_dir() else []
    moved += [path for path in (tracker_path(run_dir), best_path(run_dir)) if path.exists()]
    if not moved:
        return []
    aside = superseded_dir(run_dir, stamp)
    aside.mkdir()
    for path in sorted(moved):
        path.rename(aside / path.name)
    steps = sorted(p.name for p in aside.glob(STEP_GLOB))
    return [
        f"resume: RESUME=disable: the earlier run's {len(steps)} checkpoint(s), tracker and kept "
        f"best moved to {aside} (nothing deleted; merge.sh takes a step there)"
    ]
