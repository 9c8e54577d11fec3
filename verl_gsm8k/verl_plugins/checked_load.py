"""Inside verl's loaders (LOADERS: fsdp_checkpoint_manager.py ~215-245, trainer_base.py ~895,
ray_trainer.py ~1114, checkpoint_handler.py ~177; weights_only=False), torch.load of a path is
checkpoint_files.load: a swapped or unchecked file runs no code; a refusal is one line. Each loader
is wrapped where its module is imported (after_import.py): verl has no extension point."""

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from verl_gsm8k.common.checkpoint_files import ShardError, restricted_torch_load
from verl_gsm8k.verl_plugins.after_import import after_import

PREFIX = "checked load: "  # launch/outcome.py finds the refusal in verl's log by it
LOADERS = (  # module, class, method
    ("verl.utils.checkpoint.fsdp_checkpoint_manager", "FSDPCheckpointManager", "load_checkpoint"),
    ("verl.utils.checkpoint.checkpoint_handler", "CheckpointHandler", "load_checkpoint"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer", "_load_checkpoint"),
    ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer", "_load_checkpoint"),
)


@contextmanager
def checked_loads() -> Iterator[None]:
    """Inside: every ``torch.load`` of a path in this process is the checked load."""
    original = torch.load
    if getattr(original, "_gsm8k_checked", False):  # nested: the outer one checks already
        yield
        return
    torch.load = restricted_torch_load(original)
    try:
        yield
    except ShardError as err:
        raise ShardError(f"{PREFIX}{err}") from None
    finally:
        torch.load = original


def _wrap(owner: type, name: str) -> None:
    method = getattr(owner, name)
    if getattr(method, "_gsm8k_checking", False):
        return

    @functools.wraps(method)
    def checking(*args: Any, **kwargs: Any) -> Any:
        with checked_loads():
            return method(*args, **kwargs)

    checking._gsm8k_checking = True  # type: ignore[attr-defined]
    setattr(owner, name, checking)


for _module, _owner, _name in LOADERS:
    after_import(_module, lambda m, owner=_owner, name=_name: _wrap(getattr(m, owner), name))
