"""GSM8K for verl 0.9.1's SFT trainer: chat transcripts in train/test.parquet (docs/data.md).

    python -m data_prep.sft --source /path/to/gsm8k --out-dir ~/data/gsm8k-sft

A row is ``messages`` (the user turn: exactly the RL prompt data_prep.gsm8k writes, same
``--prompt-style``; the assistant turn: GSM8K's solution, its last line ``#### 72``, or
``\\boxed{72}`` under the boxed style), ``data_source`` and ``extra_info`` (split, index), as
verl's ``MultiTurnSFTDataset`` reads it. Sources, validation and atomic, byte-identical writes
are data_prep.gsm8k's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from data_prep.gsm8k import (
    DATA_SOURCE,
    Row,
    build_prompt,
    ground_truth,
    parquet_writer,
    parser,
    run,
    schema,
)
from verl_gsm8k.common.atomic_io import replace_all


def sft_rows(rows: Sequence[Row], split: str, style: str = "hash") -> list[dict]:
    """verl's multi-turn SFT rows; index: the 0-based row in its split."""
    out = []
    for index, row in enumerate(rows):
        answer = row["answer"]
        if style == "boxed":  # the last line "#### N" becomes "\boxed{N}"
            answer = f"{answer.rpartition('####')[0]}\\boxed{{{ground_truth(answer)}}}"
        messages = [{"role": "user", "content": build_prompt(row["question"], style)},
                    {"role": "assistant", "content": answer}]  # fmt: skip
        out.append({"messages": messages, "data_source": DATA_SOURCE,
                    "extra_info": {"split": split, "index": index}})  # fmt: skip
    return out


SFT_SCHEMA = {"messages": None, "data_source": None, "extra_info": ("split", "index")}


def write_sft_splits(splits: dict[str, list[Row]], out_dir: Path, style: str) -> dict[str, Path]:
    out_dir = Path(out_dir).expanduser()
    replace_all({out_dir / f"{split}.parquet": parquet_writer(sft_rows(rows, split, style),
                 schema(**SFT_SCHEMA)) for split, rows in splits.items()})  # fmt: skip
    return {split: out_dir / f"{split}.parquet" for split in splits}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser(
        "data_prep.sft",
        "Prepare GSM8K as train.parquet/test.parquet chat transcripts for verl 0.9.1's SFT "
        "trainer (MultiTurnSFTDataset: a 'messages' column with the RL training prompt as the "
        "user turn and GSM8K's worked solution as the assistant turn). Every row is validated "
        "before anything is written.",
        "~/data/gsm8k-sft",
        "the user turn's instruction, as python -m data_prep.gsm8k writes it for the RL stage: "
        "'hash' (default; answers end '#### N') or 'boxed' (answers end '\\boxed{N}'); use the "
        "style the RL data will use",
    ).parse_args(argv)
    write = partial(write_sft_splits, out_dir=args.out_dir, style=args.prompt_style)
    return run("data_prep.sft", args, write, "conversations")


if __name__ == "__main__":
    sys.exit(main())
