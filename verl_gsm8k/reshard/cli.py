"""``python -m verl_gsm8k.reshard RUN_DIR --world-size N [--step S]``: the checkpoint a relaunch
resumes (or step S) rewritten for N ranks (reshard/shards.py). Exit 0: resharded (or at N
already), one line per role; 2: one line naming what stopped it, the checkpoint unchanged.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from verl_gsm8k.common.run_dir import STEP_N, TRACKER, step_dir, step_name, tracked_step
from verl_gsm8k.reshard.shards import PROG, ReshardError, reshard_step


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m verl_gsm8k.{PROG}",
        description="Rewrite a PPO checkpoint's FSDP shards (weights, optimizer, scheduler and RNG "
        "states) for another world size, the originals kept, for verl to resume it on another "
        "number of GPUs (the launcher does it when a resume changes only the GPU count).",
    )
    parser.add_argument("run_dir", type=Path, help=f"the run directory (RUN_DIR) holding {STEP_N}/")
    parser.add_argument("--world-size", type=int, required=True, help="the number of ranks the "
                        "run resumes on: trainer.nnodes x trainer.n_gpus_per_node")  # fmt: skip
    parser.add_argument("--step", type=int, help=f"the step to reshard (default: the one "
                        f"{TRACKER} names, which verl resumes)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    step = args.step if args.step is not None else tracked_step(args.run_dir)
    if step is None:
        print(f"{PROG}: {args.run_dir} has no {TRACKER} naming a step: pass --step",
              file=sys.stderr)  # fmt: skip
        return 2
    folder = step_dir(args.run_dir, step)
    if not folder.is_dir():
        print(f"{PROG}: no {step_name(step)} in {args.run_dir}", file=sys.stderr)
        return 2
    try:
        said = reshard_step(folder, args.world_size)
    except ReshardError as error:
        print(f"{PROG}: {folder}: {error} (the checkpoint as saved is unchanged)", file=sys.stderr)
        return 2
    for line in said or [f"{PROG}: {folder.name} is at world size {args.world_size} already"]:
        print(line)
    return 0
