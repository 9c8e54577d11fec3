"""Puts the recipes' trainers (ppo_trainer/) where verl builds its PPO trainer, for a config with
``trainer.v1.trainer_mode=gsm8k`` (every PPO launch). verl imports this module in every process,
so each action waits for its verl module (after_import.py; verl's trainer costs ~2 s to import):

- v1: ppo_trainer/traced.py, imported right after ``verl.trainer.ppo.v1`` (only verl's
  TaskRunner imports it, before it looks its trainer up by mode), enters verl's registry;
- legacy (``trainer.use_v1=false``): no registry; ``TaskRunner.run`` builds ``RayPPOTrainer`` by
  its name in ``verl.trainer.main_ppo_v0`` (~218): that name builds ``GuardedLegacyTrainer``.
"""

from __future__ import annotations

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
