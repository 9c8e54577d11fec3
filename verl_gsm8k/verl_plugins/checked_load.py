"""verl's checkpoint loads, checked in the process that loads them, from the handle they load.

The launcher checks every file of the checkpoint a relaunch resumes from (resume/verify.py), but
verl loads them one to three minutes later, in other processes, each with
``torch.load(..., weights_only=False)``, which imports and calls whatever a pickle names:
  each FSDP worker       its rank's model, optimizer and extra-state shard
                         (verl/utils/checkpoint/fsdp_checkpoint_manager.py ~215, ~235, ~245);
  the trainer            data.pt (verl/trainer/ppo/v1/trainer_base.py ~895; the legacy trainer,
                         which the LoRA recipe runs: verl/trainer/ppo/ray_trainer.py ~1114;
                         the SFT trainer: verl/utils/checkpoint/checkpoint_handler.py ~177).
A file swapped in between, a ``trainer.resume_from_path`` the launcher never reads, or a shard of
another world size than the saved one would be loaded unchecked.

So while verl loads a checkpoint, ``torch.load`` of a path in that process is the checked load of
common/checkpoint_files.py, whatever ``weights_only`` verl passes: the file opened once, that open
handle checked (one zip archive from byte 0, every record's CRC, every pickle's globals on the
allow-list, read through torch's own reader) and loaded from the same handle by torch's
weights-only unpickler with the allow-list registered: what is loaded is what was checked,
whatever the path names by then, and even a file changed in place cannot run code. A file that
fails is refused with one line naming it (ShardError, "checked load: ..."), which the launcher
repeats as its last line (launch/outcome.py).

Active only inside verl's loaders (``checked_loads``), nowhere else. The workers' loader
has no extension point, so each loader is wrapped right after its module is imported, in the
process that imports it (verl imports this module in every process: VERL_USE_EXTERNAL_MODULES,
named by the launcher for every launch): ``FSDPCheckpointManager.load_checkpoint`` in the
workers, ``_load_checkpoint`` of the v1 trainer base (which the recipes' registered trainer
inherits) and of the legacy trainer, and the SFT trainer's ``CheckpointHandler.load_checkpoint``,
in the trainer's process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from verl_gsm8k.common.checkpoint_files import ShardError, restricted_torch_load
from verl_gsm8k.verl_plugins.after_import import after_import

PREFIX = "checked load: "  # launch/outcome.py finds the refusal in verl's log by it


def _checked(load: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.load`` whose refusals say that they come from the checked load."""
    restricted = restricted_torch_load(load)

    @functools.wraps(load)
    def checked_load(*args: Any, **kwargs: Any) -> Any:
        try:
            return restricted(*args, **kwargs)
        except ShardError as err:
            raise ShardError(f"{PREFIX}{err}") from None

    checked_load._gsm8k_checked = True  # type: ignore[attr-defined]
    return checked_load


@contextmanager
def checked_loads() -> Iterator[None]:
    """Inside: every ``torch.load`` of a path in this process is checked first (``_checked``)."""
    original = torch.load
    if getattr(original, "_gsm8k_checked", False):  # nested: the outer context checks already
        yield
        return
    torch.load = _checked(original)
    try:
        yield
    finally:
        torch.load = original


def checking(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run inside ``checked_loads``."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with checked_loads():
            return method(*args, **kwargs)

    wrapper._gsm8k_checking = True  # type: ignore[attr-defined]
    return wrapper


def _wrap(owner: type, name: str) -> None:
    method = getattr(owner, name)
    if not getattr(method, "_gsm8k_checking", False):
        setattr(owner, name, checking(method))


def _workers(module: Any) -> None:
    _wrap(module.FSDPCheckpointManager, "load_checkpoint")


def _trainer(module: Any) -> None:
    _wrap(module.PPOTrainer, "_load_checkpoint")


def _legacy_trainer(module: Any) -> None:
    _wrap(module.RayPPOTrainer, "_load_checkpoint")


def _sft_trainer(module: Any) -> None:
    _wrap(module.CheckpointHandler, "load_checkpoint")


after_import("verl.utils.checkpoint.fsdp_checkpoint_manager", _workers)
after_import("verl.utils.checkpoint.checkpoint_handler", _sft_trainer)
after_import("verl.trainer.ppo.v1.trainer_base", _trainer)
after_import("verl.trainer.ppo.ray_trainer", _legacy_trainer)
