"""python -m verl.model_merger with torch.load the one loading policy (its weights_only=False
loads: fsdp_model_merger.py ~108, ~168). A refusal: one line, exit 2."""

import sys

import torch

from verl_gsm8k.common.checkpoint_files import ShardError, restricted_torch_load


def main() -> int:
    torch.load = restricted_torch_load(torch.load)
    from verl.model_merger.__main__ import main as verl_main

    try:
        verl_main()
    except ShardError as err:
        print(f"verl's merger: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
