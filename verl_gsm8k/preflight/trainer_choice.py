"""Which trainer a PPO config runs: verl_gsm8k/ppo_trainer/ (mode ``gsm8k``) selected and
registered, with the trace on or off, or verl's legacy trainer, which runs neither, and why.

The guard (verified checkpoints, the watchdog, the kept best, a save on SIGTERM) and the per-token
trace live in verl's v1 trainer registered as ``gsm8k``; the legacy trainer
(``trainer.use_v1=false``, which the LoRA recipe needs) has no trainer registry, so a config that
runs it has neither, and says so.
"""

from __future__ import annotations

import os
from typing import Any

from verl_gsm8k.common.run_dir import TRACE_DIR
from verl_gsm8k.preflight.lines import Report

MODE = "gsm8k"
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
    if not cfg.trainer.get("use_v1", True):
        report.ok(
            "trace",
            "off: this config runs verl's legacy trainer (trainer.use_v1=false), which has no "
            "trainer registry to record from; RUN_DIR/trace/ stays empty",
        )
        report.warn(
            "guard",
            "verl's legacy trainer (trainer.use_v1=false) runs without the recipes' guard: no "
            "watchdog, no kept best checkpoint, verl's own tracker write and pruning "
            "(docs/reliability.md); a relaunch still verifies the checkpoint it resumes",
        )
        return
    if PLUGIN not in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(","):
        report.error(
            "trace",
            f"trainer.v1.trainer_mode={MODE} needs {PLUGIN} in VERL_USE_EXTERNAL_MODULES (it "
            "registers the trainer in verl's TaskRunner); the recipes add it to every PPO launch",
        )
        return
    import importlib

    importlib.import_module(PLUGIN)
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer = get_trainer_cls(MODE)
    where = block.get("dir") or f"{cfg.trainer.default_local_dir}/{TRACE_DIR}"
    if samples <= 0:
        report.ok("trace", f"{trainer.__name__} selected, gsm8k_trace.samples=0: nothing traced")
        return
    report.ok(
        "trace",
        f"{samples} responses per step (whole prompt groups of rollout.n="
        f"{cfg.actor_rollout_ref.rollout.n}) -> {where}/<step>.jsonl",
    )
