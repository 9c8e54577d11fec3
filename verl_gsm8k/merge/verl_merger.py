"""verl's merger, with every ``torch.load`` of a path in it the checked load.

    python -m verl_gsm8k.merge.verl_merger merge --backend fsdp --local_dir DIR --target_dir OUT

is ``python -m verl.model_merger`` (the same arguments, verl's own code) in a process whose
``torch.load`` is common/checkpoint_files.py's ``restricted_torch_load``: verl 0.9.1's merger loads
every model shard with ``weights_only=False`` (verl/model_merger/fsdp_model_merger.py ~108, ~168),
and the merge's own check of the shards (merge/find.py) runs in another process, earlier. Here
each shard is checked again on the handle torch then reads, and loaded by torch's weights-only
unpickler: a shard changed after that check still cannot run code. A refusal: one line, exit 2.
merge/checkpoint.py runs it.
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
