"""``python -m verl_gsm8k.sft_trainer``: verl's SFT entry (verl/trainer/sft_trainer.py ``main``,
``run_sft``) building ``StoppableSFTTrainer``, under torchrun."""

import hydra
import torch.distributed as dist
from omegaconf import DictConfig
from verl.utils.device import auto_set_device
from verl.utils.distributed import destroy_global_process_group, initialize_global_process_group

from verl_gsm8k.common.children import die_with_parent
from verl_gsm8k.guard import say
from verl_gsm8k.sft_trainer.stoppable import StoppableSFTTrainer


@hydra.main(config_path=None, config_name=None, version_base=None)
def main(config: DictConfig) -> None:
    die_with_parent()
    auto_set_device(config)  # as verl's main: trainer.device on an Ascend NPU
    initialize_global_process_group()
    trainer = StoppableSFTTrainer(config=config)
    trainer.fit()
    if dist.get_rank() == 0 and trainer.stopped_at is not None:
        say(f"stopped after saving step {trainer.stopped_at}")
    destroy_global_process_group()


if __name__ == "__main__":
    main()
