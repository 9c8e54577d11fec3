"""Hold a process at a named moment, so that a test's kill or signal lands there instead of racing a
timer; importing this module wraps the product's function at each seam. GSM8K_PAUSE_AT=point[,...]:
at a point the process writes its pid to GSM8K_PAUSE_FILE and waits until it is killed or the file
is deleted (once per point). verl's processes import it via ``env``.

    save:<step>:after_<role>  the PPO trainer, between the actor's shards and the critic's
    rollout:<step>            the PPO trainer, before the step's rollout (v1 and legacy)
    load:before_open          verl's checked load of a checkpoint file, in its worker
    sft_step:<step>           the SFT trainer, before the step trains
    prune:after_rename        pruning, between a step directory's rename and its removal
"""

import functools
import os
import shutil
import time
from pathlib import Path
from typing import Any

from verl_gsm8k.verl_plugins.after_import import after_import

TESTS = Path(__file__).resolve().parent
POINTS = [p for p in os.environ.get("GSM8K_PAUSE_AT", "").split(",") if p]


def env(points: str, file: Path, base: dict[str, str]) -> dict[str, str]:
    """``base`` with the variables that hold the launch's processes at ``points``."""
    modules = ",".join(m for m in (base.get("VERL_USE_EXTERNAL_MODULES"), "pause_points") if m)
    path = os.pathsep.join(p for p in (str(TESTS), base.get("PYTHONPATH")) if p)
    return dict(base, GSM8K_PAUSE_AT=points, GSM8K_PAUSE_FILE=str(file), PYTHONPATH=path,
                VERL_USE_EXTERNAL_MODULES=modules)  # fmt: skip


def hold(name: str) -> None:
    if name not in POINTS:
        return
    target = Path(os.environ["GSM8K_PAUSE_FILE"])
    released = target.with_name(f"{target.name}.released-{name.replace(':', '-')}")
    if released.exists():
        return
    partial = target.with_name(f".{target.name}.tmp")
    partial.write_text(f"{os.getpid()}\n", encoding="utf-8")
    os.replace(partial, target)
    while target.exists():
        time.sleep(0.2)
    released.touch()


def _wrap(owner: Any, name: str, before: Any = None, after: Any = None) -> None:
    """``owner.name`` calls ``before`` first and ``after`` once it returned, with its args."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def held(*args: Any, **kwargs: Any) -> Any:
        if before:
            before(*args, **kwargs)
        result = original(*args, **kwargs)
        if after:
            after(*args, **kwargs)
        return result

    setattr(owner, name, held)


def _guard_base(module: Any) -> None:
    def saved(self: Any, role: str, group: Any, folder: Any, step: int) -> None:
        hold(f"save:{step}:after_{role}")

    _wrap(module.GuardBase, "_save_role", after=saved)


def _traced(module: Any) -> None:
    def rollout(self: Any, *_: Any) -> None:
        hold(f"rollout:{self.global_steps}")

    _wrap(module.TracingTrainer, "step", before=rollout)


def _legacy(module: Any) -> None:
    loader = module._StoppingLoader
    batches = loader.__iter__

    def each_batch(self: Any) -> Any:
        for batch in batches(self):  # after the stop request is read, before the rollout
            hold(f"rollout:{self.trainer.global_steps}")
            self.trainer.step_started = time.time()
            yield batch

    loader.__iter__ = each_batch


def _sft(module: Any) -> None:
    def built(self: Any) -> None:
        step = self.training_client.train_batch

        def train_batch(*args: Any, **kwargs: Any) -> Any:
            hold(f"sft_step:{self.trained + 1}")
            return step(*args, **kwargs)

        self.training_client.train_batch = train_batch

    _wrap(module.StoppableSFTTrainer, "_build_engine", after=built)


def _checked_load(module: Any) -> None:
    restricted = module.restricted_torch_load

    def held_restricted(original: Any) -> Any:
        load = restricted(original)

        @functools.wraps(load)
        def held(f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, (str, os.PathLike)):
                hold("load:before_open")
            return load(f, *args, **kwargs)

        return held

    module.restricted_torch_load = held_restricted


def _rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
    if str(path).endswith(".removing"):
        hold("prune:after_rename")
    _original_rmtree(path, *args, **kwargs)


if POINTS:
    _original_rmtree, shutil.rmtree = shutil.rmtree, _rmtree  # type: ignore[assignment]
    for _name, _action in (
        ("verl_gsm8k.ppo_trainer.guard_base", _guard_base),
        ("verl_gsm8k.ppo_trainer.traced", _traced),
        ("verl_gsm8k.ppo_trainer.legacy", _legacy),
        ("verl_gsm8k.sft_trainer.stoppable", _sft),
        ("verl_gsm8k.verl_plugins.checked_load", _checked_load),
    ):
        after_import(_name, _action)
