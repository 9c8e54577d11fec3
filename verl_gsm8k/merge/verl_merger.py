"""``python -m verl_gsm8k.merge.verl_merger merge --backend fsdp --local_dir DIR --target_dir
OUT`` is ``python -m verl.model_merger`` (verl's code, its arguments) with ``torch.load`` the
one loading policy (common/checkpoint_files.py): its loads of the model shards
(``weights_only=False``: verl/model_merger/fsdp_model_merger.py ~108, ~168) run no code. A
refusal: one line, exit 2. merge/checkpoint.py runs it.
"""

from __future__ import annotations

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
