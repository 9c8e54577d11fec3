"""verl's ``SFTTrainer`` (``verl/trainer/sft_trainer.py``) with a stop that loses no step: a
SIGTERM to the launcher, or to every process of the launch, saves the step in flight and ends
the run, which the launcher then reports with exit status 5 as it does for PPO.

The launcher starts torchrun with SIGTERM blocked, a mask its workers inherit, so the signal
that Slurm's requeue, a preemption or ``kill`` sends to every process no longer ends them; the
launcher writes RUN_DIR/stop_requested (verl_gsm8k/launch/supervise.py), and a SIGTERM to a
worker alone writes it too (verl_plugins/stop_on_sigterm.py). verl's ``fit`` is one loop with no
hook, so this class wraps two calls of its own objects, each once, at build time:

- ``training_client.train_batch`` (``fit`` ~388, once per step, before the step's logging,
  validation and save): after the step trains, every rank reads the stop request and they agree
  on it (one all-reduce); on a stop the total steps become this step, so ``fit``'s own
  ``is_last_step`` (~412) saves it and returns (~441-448), with the validation of a last step
  skipped (a stop should be quick; the next launch validates on schedule).
- ``ckpt_handler.save_checkpoint`` (~443): rank 0 writes the launch's stamp into the step
  directory before verl saves there (``launch_stamp.txt``: the launcher's closing line and the
  same-config check of a relaunch read which launch saved a step).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed
from omegaconf import DictConfig
from verl.trainer.sft_trainer import SFTTrainer

from verl_gsm8k.common.launch_env import launch_stamp
from verl_gsm8k.common.pause import pause_point
from verl_gsm8k.common.run_dir import read_stop_request, step_dir, write_stamp
from verl_gsm8k.guard import say


class StoppableSFTTrainer(SFTTrainer):
    """verl's SFT trainer that saves the step in flight on a stop request (module docstring)."""

    def __init__(self, config: DictConfig) -> None:
        self.run_dir = Path(config.trainer.default_local_dir)
        self.stamp = launch_stamp()
        self.stopped_at: int | None = None  # the step after which fit ended on a stop request
        super().__init__(config)
        self.trained = self.resume_global_step  # the last step trained (fit counts from here)

    def _build_engine(self) -> None:
        super()._build_engine()
        train_batch = self.training_client.train_batch

        def train_batch_then_read_stop(*args: Any, **kwargs: Any) -> Any:
            pause_point(f"sft_step:{self.trained + 1}")  # tests: a signal lands in this step
            output = train_batch(*args, **kwargs)
            self.trained += 1
            if self.stopped_at is None and self._stop_requested():
                self._end_after(self.trained)
            return output

        self.training_client.train_batch = train_batch_then_read_stop

    def _build_ckpt_handler(self) -> None:
        super()._build_ckpt_handler()
        save_checkpoint = self.ckpt_handler.save_checkpoint

        def save_stamped(step: int) -> None:
            if self.rank == 0 and self.stamp:
                step_dir(self.run_dir, step).mkdir(parents=True, exist_ok=True)
                write_stamp(self.run_dir, step, self.stamp)
            save_checkpoint(step=step)

        self.ckpt_handler.save_checkpoint = save_stamped

    def _stop_requested(self) -> bool:
        """Whether any rank sees a stop request: they stop after the same step, or the ones still
        training would wait for the others' collectives forever."""
        seen = read_stop_request(self.run_dir, time.time()) is not None
        if torch.distributed.get_world_size() == 1:
            return seen
        flag = torch.tensor([int(seen)], device=self.config.trainer.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _end_after(self, step: int) -> None:
        self.stopped_at = step
        self.total_training_steps = step  # fit: is_last_step -> save this step, return
        self.val_dataloader = None  # ... without the last step's validation
        self.test_freq = -1  # fit validates when test_freq > 0 and step % test_freq == 0
        if self.rank == 0:
            say(f"stop requested (SIGTERM): saving step {step}, then stopping")

    def say_how_it_ended(self) -> None:
        if self.stopped_at is not None:
            say(f"stopped after saving step {self.stopped_at}")
