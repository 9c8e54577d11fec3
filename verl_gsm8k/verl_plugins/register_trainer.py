"""Registers the trainer every PPO launch runs (``verl_gsm8k.ppo_trainer.traced``, mode ``gsm8k``:
guarded, traced) in verl's trainer registry, in the process that builds verl's trainer.

verl imports this module in every process (VERL_USE_EXTERNAL_MODULES, named by
the launcher for every PPO launch). Importing verl's trainer package costs ~2 s and
~190 MB per process, so nothing is imported here: the trainer module is imported right after
``verl.trainer.ppo.v1`` is, which only verl's TaskRunner does (``verl/trainer/main_ppo.py`` ~139),
just before it looks the trainer up by ``trainer.v1.trainer_mode``.
"""

from __future__ import annotations

import importlib
import types

from verl_gsm8k.verl_plugins.after_import import after_import

TRAINER_PACKAGE = "verl.trainer.ppo.v1"


def _register(_package: types.ModuleType) -> None:
    importlib.import_module("verl_gsm8k.ppo_trainer.traced")


after_import(TRAINER_PACKAGE, _register)
