"""``python -m verl_gsm8k.sft_trainer``: verl's SFT entry (``verl/trainer/sft_trainer.py`` ``main``
and ``run_sft``) with ``StoppableSFTTrainer``. The launcher (verl_gsm8k/launch/) runs it under
torchrun with ``--config-path`` and ``--config-name``, as it would verl's. Each worker dies with
torchrun, which dies with the launcher (launch/supervise.py ``start``)."""

from __future__ import annotations

import hydra
import torch
from omegaconf import DictConfig
from verl.utils.device import auto_set_device
from verl.utils.distributed import destroy_global_process_group, initialize_global_process_group

from verl_gsm8k.common.children import die_with_parent
from verl_gsm8k.sft_trainer.stoppable import StoppableSFTTrainer


@hydra.main(config_path=None, config_name=None, version_base=None)
def main(config: DictConfig) -> None:
    die_with_parent()  # torchrun: a worker never trains on without it
    auto_set_device(config)  # as verl's main: trainer.device on an Ascend NPU
    initialize_global_process_group()
    trainer = StoppableSFTTrainer(config=config)
    trainer.fit()
    if torch.distributed.get_rank() == 0:
        trainer.say_how_it_ended()
    destroy_global_process_group()


if __name__ == "__main__":
    main()
