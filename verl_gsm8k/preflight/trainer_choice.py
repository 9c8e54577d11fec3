"""Which trainer a PPO config runs: verl_gsm8k/ppo_trainer/'s (mode ``gsm8k``), on verl's v1
trainer or its legacy one (``trainer.use_v1=false``), with the trace on or off, or verl's own
trainer unguarded, and why.

The guard (verified checkpoints, the watchdog, the kept best, a save on SIGTERM) and the per-token
trace run in both of verl's trainers when ``trainer.v1.trainer_mode=gsm8k`` and the plugin that
puts them in place (``verl_plugins/register_trainer.py``) is loaded.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from verl_gsm8k.common.run_dir import TRACE_DIR
from verl_gsm8k.ppo_trainer import MODE
from verl_gsm8k.preflight.lines import Report

PLUGIN = "verl_gsm8k.verl_plugins.register_trainer"


def check_trainer(cfg: Any, report: Report) -> None:
    block = cfg.get("gsm8k_trace") or {}
    samples = int(block.get("samples", 0) or 0)
    mode = str(cfg.trainer.get("v1", {}).get("trainer_mode", "sync"))
    if mode != MODE:
        if samples > 0:
            report.warn(
                "trace",
                f"gsm8k_trace.samples={samples} but trainer.v1.trainer_mode={mode}: nothing is "
                f"traced (the trace needs trainer.v1.trainer_mode={MODE}, which the recipes set)",
            )
        return
    if PLUGIN not in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(","):
        report.error(
            "trace",
            f"trainer.v1.trainer_mode={MODE} needs {PLUGIN} in VERL_USE_EXTERNAL_MODULES (it "
            "registers the trainer in verl's TaskRunner); the recipes add it to every PPO launch",
        )
        return
    if cfg.trainer.get("use_v1", True):
        importlib.import_module(PLUGIN)  # it registers the trainer when verl's v1 is imported
        from verl.trainer.ppo.v1 import get_trainer_cls

        trainer = get_trainer_cls(MODE)
    else:  # what verl_plugins/register_trainer.py builds in place of verl's RayPPOTrainer
        from verl_gsm8k.ppo_trainer.legacy import GuardedLegacyTrainer as trainer
    where = block.get("dir") or f"{cfg.trainer.default_local_dir}/{TRACE_DIR}"
    if samples <= 0:
        report.ok("trace", f"{trainer.__name__} selected, gsm8k_trace.samples=0: nothing traced")
        return
    report.ok(
        "trace",
        f"{samples} responses per step (whole prompt groups of rollout.n="
        f"{cfg.actor_rollout_ref.rollout.n}) -> {where}/<step>.jsonl",
    )
