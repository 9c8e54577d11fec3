"""verl's SFTTrainer ending, the step saved, on a stop request (exit 5) or after a validation loss
under gsm8k_sft.stop_val_loss (exit 0). fit has no hook: after training_client.train_batch (~388)
the ranks agree (all-reduce) and the total becomes this step, so is_last_step (~412) saves it;
infer_batch (~421) gives the losses; save_checkpoint (~443): rank 0 stamps the step."""

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from verl.trainer.sft_trainer import SFTTrainer
from verl.utils import tensordict_utils as tu

from verl_gsm8k.common.launch_env import launch_stamp
from verl_gsm8k.common.run_dir import step_dir, write_stamp
from verl_gsm8k.guard import say
from verl_gsm8k.guard.stop import read_request


class StoppableSFTTrainer(SFTTrainer):
    def __init__(self, config: DictConfig) -> None:
        self.run_dir = Path(config.trainer.default_local_dir)
        self.stamp = launch_stamp()
        self.stopped_at: int | None = None
        self.stop_val_loss = (config.get("gsm8k_sft") or {}).get("stop_val_loss")
        self.val_losses: list[float] = []  # this rank's, of the validation since the last step
        self.validated = False  # every rank validates at the same steps
        super().__init__(config)
        self.trained = self.resume_global_step  # the last step trained

    def _build_engine(self) -> None:
        super()._build_engine()
        client = self.training_client
        train_batch, infer_batch = client.train_batch, client.infer_batch

        def train_then_read_stop(*args: Any, **kwargs: Any) -> Any:
            output = train_batch(*args, **kwargs)
            self.trained += 1
            if self.stopped_at is None and self._stop_requested():
                self._end_after(self.trained)
            elif self.stopped_at is None and self._learned():
                self._end_after(self.trained, f"validation loss under {self.stop_val_loss}")
            self.val_losses, self.validated = [], False
            return output

        def infer_then_keep_loss(*args: Any, **kwargs: Any) -> Any:
            output, self.validated = infer_batch(*args, **kwargs), True
            if self.engine.is_mp_src_rank_with_outputs():
                self.val_losses.append(float(tu.get(output, "metrics")["loss"]))
            return output

        client.train_batch, client.infer_batch = train_then_read_stop, infer_then_keep_loss

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

    def _learned(self) -> bool:
        """The mean loss of the last validation (every rank's batches) under stop_val_loss."""
        if self.stop_val_loss is None or not self.validated:
            return False
        summed = torch.tensor([sum(self.val_losses), len(self.val_losses)], dtype=torch.float64,
                              device=self.config.trainer.device)  # fmt: skip
        if dist.get_world_size() > 1:
            dist.all_reduce(summed)
        return bool(summed[0] / summed[1] < self.stop_val_loss)

    def _end_after(self, step: int, why: str = "stop requested (SIGTERM)") -> None:
        self.stopped_at = step
        self.total_training_steps = step  # fit: is_last_step -> save this step, return
        self.val_dataloader, self.test_freq = None, -1  # ... without the last validation
        if self.rank == 0:
            say(f"{why}: saving step {step}, then stopping")
