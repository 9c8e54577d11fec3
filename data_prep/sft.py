"""Prepare GSM8K for verl 0.9.1's SFT trainer: chat transcripts in train/test.parquet.

    python -m data_prep.sft --source /path/to/gsm8k --out-dir ~/data/gsm8k-sft

Each row is one problem as verl's ``MultiTurnSFTDataset`` reads it (``data.messages_key``, default
``messages``)::

    messages     [{"role": "user", "content": <the RL training prompt of this question>},
                  {"role": "assistant", "content": <GSM8K's worked solution, ending "#### 72">}]
    data_source  "openai/gsm8k"
    extra_info   {"split": "train", "index": 0}

The user turn is exactly the prompt ``python -m data_prep.gsm8k`` writes for the PPO recipes
(``build_prompt``, same ``--prompt-style``), so the supervised stage and the RL stage see the same
input. The assistant turn is GSM8K's solution as released (calculator annotations ``<<48/2=24>>``
included), so its last line is ``#### <answer>``, the line the reward reads. With
``--prompt-style boxed`` the prompt asks for ``\\boxed{}``, so that last line becomes
``\\boxed{<answer>}`` (the number as the reward's ground truth has it: commas removed).
verl computes the loss on the assistant turn only (its tokens after ``<|im_start|>assistant\\n``,
up to and including the end-of-turn marker).

Sources, validation and guarantees are those of ``data_prep.gsm8k``, whose code this module
reuses: the hub (``openai/gsm8k``, the default) or ``--source DIR`` (OpenAI's
``train.jsonl``/``test.jsonl``, or the hub's parquet layout); every row is validated before
anything is written and a bad row stops with one line naming the file and line, exit 2; outputs are
written to temporary files and moved into place together, so a failure leaves earlier outputs as
they were; the same input gives byte-identical files.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data_prep.gsm8k import (
    DATA_SOURCE,
    DEFAULT_PROMPT_STYLE,
    HUB_CONFIG,
    HUB_ID,
    PROMPT_STYLES,
    SPLITS,
    Row,
    build_prompt,
    ground_truth,
    parquet_writer,
    positive_int,
    read_and_write,
)
from verl_gsm8k.common.atomic_io import Writers, replace_all

PROG = "data_prep.sft"
DEFAULT_OUT_DIR = "~/data/gsm8k-sft"
MESSAGES_KEY = "messages"  # verl's data.messages_key default
_MARKER = "####"


def assistant_answer(answer: str, style: str = DEFAULT_PROMPT_STYLE) -> str:
    """The assistant turn for a GSM8K solution, ending in the answer format ``style`` asks for.

    ``hash``: the solution as released (it ends ``#### <answer>``). ``boxed``: the same, with the
    final ``#### <answer>`` line replaced by ``\\boxed{<answer>}``. ValueError on a solution
    without a numeric ``####`` line (``load_source`` has already refused those).
    """
    truth = ground_truth(answer)
    if style == "hash":
        return answer
    if style == "boxed":
        head, _, _ = answer.rpartition(_MARKER)
        return f"{head}\\boxed{{{truth}}}"
    raise ValueError(f"unknown prompt style {style!r}; known: {', '.join(PROMPT_STYLES)}")


def sft_rows(rows: Sequence[Row], split: str, style: str = DEFAULT_PROMPT_STYLE) -> list[dict]:
    """Validated source rows -> verl's multi-turn SFT rows (index: 0-based row in its split)."""
    return [
        {
            MESSAGES_KEY: [
                {"role": "user", "content": build_prompt(row["question"], style)},
                {"role": "assistant", "content": assistant_answer(row["answer"], style)},
            ],
            "data_source": DATA_SOURCE,
            "extra_info": {"split": split, "index": index},
        }
        for index, row in enumerate(rows)
    ]


def sft_schema() -> Any:
    import pyarrow as pa

    text = pa.string()
    return pa.schema(
        [
            (MESSAGES_KEY, pa.list_(pa.struct([("role", text), ("content", text)]))),
            ("data_source", text),
            ("extra_info", pa.struct([("split", text), ("index", pa.int64())])),
        ]
    )


def sft_writers(splits: dict[str, list[Row]], out_dir: Path, style: str) -> Writers:
    schema = sft_schema()
    return {
        out_dir / f"{split}.parquet": parquet_writer(sft_rows(rows, split, style), schema)
        for split, rows in splits.items()
    }


def write_sft_splits(
    splits: dict[str, list[dict[str, str]]], out_dir: Path, style: str = DEFAULT_PROMPT_STYLE
) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.parquet`` for each split, all atomically; returns split -> path."""
    out_dir = Path(out_dir).expanduser()
    replace_all(sft_writers(splits, out_dir, style))
    return {split: out_dir / f"{split}.parquet" for split in splits}


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Prepare GSM8K as train.parquet/test.parquet chat transcripts for verl 0.9.1's "
        "SFT trainer (MultiTurnSFTDataset: a 'messages' column with the RL training prompt as the "
        "user turn and GSM8K's worked solution as the assistant turn). Every row is validated "
        "before anything is written.",
    )
    parser.add_argument(
        "--source",
        default=HUB_ID,
        help=f"where GSM8K comes from: a hub dataset id (default {HUB_ID}, config {HUB_CONFIG}, "
        "needs network or a datasets cache), or a directory holding OpenAI's "
        "train.jsonl/test.jsonl or the hub parquet layout (as python -m data_prep.gsm8k)",
    )
    parser.add_argument(
        "--out-dir",
        default=DEFAULT_OUT_DIR,
        help=f"directory for train.parquet and test.parquet (default {DEFAULT_OUT_DIR}; created if "
        "missing; existing files are replaced atomically, and only when every row is valid)",
    )
    parser.add_argument(
        "--prompt-style",
        choices=list(PROMPT_STYLES),
        default=DEFAULT_PROMPT_STYLE,
        help="the user turn's instruction, as python -m data_prep.gsm8k writes it for the RL "
        "stage: 'hash' (default; answers end '#### N') or 'boxed' (the prompt asks for "
        "\\boxed{}, so each answer's last line '#### N' becomes '\\boxed{N}'); use the style "
        "the RL data will use",
    )
    parser.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help="keep only the first N rows of each split (for quick runs)",
    )
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=list(SPLITS),
        default=list(SPLITS),
        metavar="SPLIT",
        help="splits to prepare, of: train test (default: both; the SFT recipe validates on test)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    splits = list(dict.fromkeys(args.splits))  # de-duplicated, order kept
    out_dir = Path(args.out_dir).expanduser()
    done = read_and_write(
        PROG,
        args.source,
        args.limit,
        splits,
        lambda data: write_sft_splits(data, out_dir, args.prompt_style),
    )
    if isinstance(done, int):
        return done
    data, paths = done
    print(f"{PROG}: source {args.source}, prompt style {args.prompt_style}")
    for split, path in paths.items():
        print(f"  {split}: {len(data[split])} conversations -> {path}")
    print(f"{PROG}: done in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
