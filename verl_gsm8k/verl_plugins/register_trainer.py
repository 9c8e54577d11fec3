"""Puts the recipes' guarded, traced trainers (``verl_gsm8k/ppo_trainer/``) where verl builds its
PPO trainer, in the process that builds it, for a config with ``trainer.v1.trainer_mode=gsm8k``
(the launcher sets it for every PPO launch):

- the v1 trainer (``trainer.use_v1=true``): ``ppo_trainer/traced.py`` is imported right after
  ``verl.trainer.ppo.v1`` is, which only verl's TaskRunner does (``verl/trainer/main_ppo.py``
  ~139), just before it looks the trainer up by ``trainer.v1.trainer_mode``; the module enters
  its class in verl's trainer registry under that name.
- the legacy trainer (``trainer.use_v1=false``: the LoRA and ReMax recipes) has no registry: its
  ``TaskRunner.run`` builds ``RayPPOTrainer`` by the module-level name in
  ``verl.trainer.main_ppo_v0`` (~218). That name is replaced there by a function that builds
  ``ppo_trainer/legacy.py``'s ``GuardedLegacyTrainer`` for a config in mode ``gsm8k`` and verl's
  own class for any other.

verl imports this module in every process (VERL_USE_EXTERNAL_MODULES, named by the launcher for
every PPO launch). Importing verl's trainer package costs ~2 s and ~190 MB per process, so nothing
is imported here: each action runs where and when its verl module is imported (after_import.py).
"""

from __future__ import annotations

import importlib
import types
from typing import Any

from verl_gsm8k.ppo_trainer import MODE
from verl_gsm8k.verl_plugins.after_import import after_import

TRAINER_PACKAGE = "verl.trainer.ppo.v1"
LEGACY_RUNNER = "verl.trainer.main_ppo_v0"


def _register(_package: types.ModuleType) -> None:
    importlib.import_module("verl_gsm8k.ppo_trainer.traced")


def _replace_legacy(module: types.ModuleType) -> None:
    verls = module.RayPPOTrainer

    def legacy_trainer(**kwargs: Any) -> Any:
        """verl's TaskRunner builds its trainer by keywords, the config among them."""
        if (kwargs["config"].trainer.get("v1") or {}).get("trainer_mode") != MODE:
            return verls(**kwargs)
        from verl_gsm8k.ppo_trainer.legacy import GuardedLegacyTrainer

        return GuardedLegacyTrainer(**kwargs)

    module.RayPPOTrainer = legacy_trainer


after_import(TRAINER_PACKAGE, _register)
after_import(LEGACY_RUNNER, _replace_legacy)
