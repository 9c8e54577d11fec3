"""verl's SFTTrainer, saving the step in flight on a stop request and ending the run (exit 5).
fit has no hook: after training_client.train_batch (~388) the ranks agree on a stop (all-reduce)
and the total becomes this step, so is_last_step (~412) saves it; ckpt_handler.save_checkpoint
(~443): rank 0 stamps the step directory."""

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from verl.trainer.sft_trainer import SFTTrainer

from verl_gsm8k.common.launch_env import launch_stamp
from verl_gsm8k.common.run_dir import step_dir, write_stamp
from verl_gsm8k.guard import say
from verl_gsm8k.guard.stop import read_request


class StoppableSFTTrainer(SFTTrainer):
    def __init__(self, config: DictConfig) -> None:
        self.run_dir = Path(config.trainer.default_local_dir)
        self.stamp = launch_stamp()
        self.stopped_at: int | None = None
        super().__init__(config)
        self.trained = self.resume_global_step  # the last step trained

    def _build_engine(self) -> None:
        super()._build_engine()
        train_batch = self.training_client.train_batch

        def train_then_read_stop(*args: Any, **kwargs: Any) -> Any:
            output = train_batch(*args, **kwargs)
            self.trained += 1
            if self.stopped_at is None and self._stop_requested():
                self._end_after(self.trained)
            return output

        self.training_client.train_batch = train_then_read_stop

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
        """Any rank's: they stop after the same step, or some would wait for the others."""
        seen = read_request(self.run_dir) is not None
        if dist.get_world_size() == 1:
            return seen
        flag = torch.tensor([int(seen)], device=self.config.trainer.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _end_after(self, step: int) -> None:
        self.stopped_at = step
        self.total_training_steps = step  # fit: is_last_step -> save this step, return
        self.val_dataloader, self.test_freq = None, -1  # ... without the last validation
        if self.rank == 0:
            say(f"stop requested (SIGTERM): saving step {step}, then stopping")
