"""Our PPO trainers where verl builds its own (trainer.v1.trainer_mode=gsm8k), once each verl
module is imported (after_import.py): v1's traced.py in verl's registry; legacy (no registry) by
the name RayPPOTrainer in verl.trainer.main_ppo_v0 (~218) bound to GuardedLegacyTrainer."""

import importlib
import types
from typing import Any

from verl_gsm8k.ppo_trainer import MODE
from verl_gsm8k.verl_plugins.after_import import after_import


def _replace_legacy(module: types.ModuleType) -> None:
    verls = module.RayPPOTrainer

    def legacy_trainer(**kwargs: Any) -> Any:
        if (kwargs["config"].trainer.get("v1") or {}).get("trainer_mode") != MODE:
            return verls(**kwargs)
        from verl_gsm8k.ppo_trainer.legacy import GuardedLegacyTrainer

        return GuardedLegacyTrainer(**kwargs)

    module.RayPPOTrainer = legacy_trainer


def _register(_package: types.ModuleType) -> None:
    importlib.import_module("verl_gsm8k.ppo_trainer.traced")


after_import("verl.trainer.ppo.v1", _register)
after_import("verl.trainer.main_ppo_v0", _replace_legacy)
