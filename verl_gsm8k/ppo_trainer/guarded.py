"""verl's v1 ``sync`` trainer with the run's guard (``guard_base.py``: whole, healthy saves of the
run's own, a save before a polite stop, the kept best), bound to the v1 loop's methods.

The registered trainer (``traced.py``, the trainer every v1 PPO launch runs) builds on this class.
What each override of verl's ``PPOTrainerSync`` (``verl/trainer/ppo/v1/trainer_base.py``) does:

- ``fit``: ``__init__`` loaded the checkpoint, so ``global_steps`` is the resumed step there
  (``GuardBase._begin``).
- ``step`` (verl ~533, run before the step's save in ``fit`` ~478-485): the watchdog, a stop
  request, the deadline and the time save, on the step's metrics and its responses read from
  TransferQueue (``GuardBase._after_update``). The run ends after a step by lowering the total:
  verl's loop runs while ``global_steps <= total_training_steps`` (~467).
- ``on_validate_begin`` and ``on_train_begin`` (~439 and ~464, after ``fit`` built its
  ``Tracking`` ~423), whichever comes first, prepare the loggers (``GuardBase._prepare_logger``).
  ``on_train_begin`` also ends ``fit`` before its first step when a stop was requested during
  start-up or the step-0 validation (nothing trained by this launch: nothing saved).
- ``on_validate_end`` (~442, ~496: after each validation) reads the stop request too: one that
  came during the validation after step N saves N (when it was not a save step) and ends ``fit``
  after it, instead of training step N+1 first.
- ``_save_checkpoint`` and ``_validate``: ``GuardBase``'s (verl's save ~948-1029, validation
  ~1031).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import DictConfig
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_gsm8k.common.pause import pause_point
from verl_gsm8k.guard.rules import prompt_of
from verl_gsm8k.ppo_trainer.guard_base import GuardBase, Observed, numeric


class GuardedTrainer(GuardBase, PPOTrainerSync):
    """verl's sync trainer with the run's protections (see the module docstring)."""

    def __init__(self, config: DictConfig) -> None:
        super().__init__(config)
        self._init_guard(config)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        self._begin(self.global_steps)  # init loaded the checkpoint
        return super().fit(*args, **kwargs)

    def on_validate_begin(self) -> None:
        self._prepare_logger(self.logger.logger)  # step 0's validation logs before on_train_begin
        super().on_validate_begin()

    def on_train_begin(self) -> None:
        self._prepare_logger(self.logger.logger)
        super().on_train_begin()
        # a stop requested during start-up (or the step-0 validation): fit ends before its first
        # step; nothing was trained by this launch, so nothing is saved
        self._stop_if_requested(self.global_steps - 1)

    def step(self, metrics: dict, timing_raw: dict) -> Any:
        pause_point(f"rollout:{self.global_steps}")  # tests: a signal lands before this rollout
        started = time.time()
        batch = super().step(metrics, timing_raw)
        self._after_update(self.global_steps, started, lambda: self._observe(batch, metrics))
        return batch

    def on_validate_end(self) -> None:
        super().on_validate_end()
        if self.sick_step is None:  # a stop requested during validation: no step more
            self._stop_if_requested(self.global_steps)

    def _end_after(self, step: int) -> None:
        super()._end_after(step)
        self.total_training_steps = step  # verl's loop condition (trainer_base.py ~467)

    def _observe(self, batch: Any, metrics: dict) -> Observed:
        """The step's metrics, and its real (not padding) responses read from TransferQueue."""
        tags = zip(batch.keys, batch.tags, strict=True)
        real = [key for key, tag in tags if not tag.get("is_padding", False)]
        fields = ["responses", "response_mask", "rm_scores"]
        data = tq.kv_batch_get(keys=real, partition_id=batch.partition_id, select_fields=fields)
        responses, scores = [], []
        rows = zip(*(_unbind(data[name]) for name in fields), strict=True)
        for ids, mask, score in rows:
            kept = zip(ids.tolist(), mask.tolist(), strict=False)
            responses.append([int(token) for token, on in kept if on])
            scores.append(float(score.float().sum()))
        return numeric(metrics), responses, scores, [prompt_of(key) for key in real]


def _unbind(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return list(value.unbind()) if value.is_nested or value.dim() > 1 else [value]
    return list(value)
