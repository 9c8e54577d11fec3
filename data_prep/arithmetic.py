"""A toy task in GSM8K's own format that a tiny model learns on a CPU: single-digit addition
(learn_tiny.sh; why this task and these rates: docs/learning.md).

    python -m data_prep.arithmetic --out-dir DIR [--max-operand 4] [--seed 0]
    python -m data_prep.gsm8k --source DIR --out-dir DIR/rl      # -> verl's RL parquet

``train.jsonl``/``test.jsonl`` in OpenAI's layout (``{"question", "answer"}``, the answer ending
``#### N``), every sum ``a + b`` in both splits in other wordings; and the warm start's
demonstrations, ``warm_start/{train,test}.parquet`` in data_prep.sft's schema, whose training
answers end with the ``#### N`` line the reward reads at a rate set by the question's writer
(``HABIT_GROUPS``, ``--marker-rates``), exactly per sum; the test ones always do. The same seed
gives the same bytes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from data_prep.gsm8k import DataPrepError, parquet_writer, schema
from data_prep.sft import SFT_SCHEMA, sft_rows
from verl_gsm8k.common.atomic_io import replace_all

PROG = "data_prep.arithmetic"
NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Alexis", "Tina")
OBJECTS = ("clips", "apples", "dollars", "pages", "eggs", "cookies", "books")
TEMPLATES = (
    "{name} has {a} {obj} and finds {b} more. How many {obj} does {name} have now?",
    "{name} made {a} {obj} in April and {b} {obj} in May. How many {obj} did {name} make "
    "altogether?",
)
HABIT_GROUPS = (NAMES[0::2], NAMES[1::2])  # whose answers end with the marker line, how often
MARKER_RATES = (0.9, 0.1)
# --task products: two-digit products, which the tiny model cannot compute but can hand to the
# calculator; the writers of the first group call it in 90% of their demonstrations, the others
# in 10% (the rest answer at once), so RL has a tool habit to learn (docs/tools.md).
# The two factors end the question, each of two digits, their product of four: a number is always
# the same tokens at the same distance from the answer (a tiny model copies by position).
PRODUCT_TEMPLATES = (
    "{name} packs the {obj} in boxes. How many {obj} are in {a} boxes of {b}?",
    "{name} buys the {obj} in bags. How many {obj} are in {a} bags of {b}?",
)
CALL_RATES = (0.9, 0.1)


def worked_answer(a: int, b: int, marker: bool = True) -> str:
    return f"{a} + {b} = {a + b}" + (f"\n#### {a + b}" if marker else "")


def habit_group(name: str) -> int:
    return 0 if name in HABIT_GROUPS[0] else 1


def make_splits(
    max_operand: int, train_per_pair: int, test_per_pair: int, seed: int,
    rates: Sequence[float] = MARKER_RATES,
) -> dict[str, list[dict[str, str]]]:  # fmt: skip
    """Each sum in ``train_per_pair`` wordings in train and ``test_per_pair`` others in test,
    shuffled by ``seed``; a row's ``demonstration`` ends with the marker in exactly
    ``round(rate x n)`` of the ``n`` training questions of its sum and group (always in test)."""
    wordings = list(itertools.product(TEMPLATES, NAMES, OBJECTS))
    needed = train_per_pair + test_per_pair
    if min(train_per_pair, test_per_pair) < 0 or needed > len(wordings):
        raise DataPrepError(f"--train-per-pair + --test-per-pair = {needed}, but only 0 to "
                            f"{len(wordings)} distinct wordings exist per pair")  # fmt: skip
    rng = random.Random(seed)
    splits: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    for a, b in itertools.product(range(max_operand + 1), repeat=2):
        chosen = rng.sample(wordings, needed)
        marked: set[int] = set()
        for group, rate in enumerate(rates):
            train = enumerate(chosen[:train_per_pair])
            members = [i for i, (_, name, _) in train if habit_group(name) == group]
            marked.update(rng.sample(members, round(rate * len(members))))
        for i, (template, name, obj) in enumerate(chosen):
            test = i >= train_per_pair
            splits["test" if test else "train"].append({
                "question": template.format(name=name, a=a, b=b, obj=obj),
                "answer": worked_answer(a, b),
                "demonstration": worked_answer(a, b, test or i in marked),
            })  # fmt: skip
    for rows in splits.values():
        rng.shuffle(rows)
    return splits


def product_splits(
    train: int, test: int, seed: int, rates: Sequence[float] = CALL_RATES
) -> dict[str, list[dict[str, str]]]:
    """``train`` and ``test`` questions ``a x b`` (31 < a, b < 100), no pair in both splits;
    a row's ``call`` says whether its demonstration calls the calculator (always in test)."""
    rng = random.Random(seed)
    pairs = rng.sample(list(itertools.product(range(32, 100), repeat=2)), train + test)
    splits: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    for i, (a, b) in enumerate(pairs):
        template, name, obj = (rng.choice(c) for c in (PRODUCT_TEMPLATES, NAMES, OBJECTS))
        split = "train" if i < train else "test"
        splits[split].append({
            "question": template.format(name=name, a=a, b=b, obj=obj),
            "answer": f"{a} * {b} = {a * b}\n#### {a * b}",
            "call": split == "test" or rng.random() < rates[habit_group(name)],
            "expression": f"{a}*{b}",
        })  # fmt: skip
    return splits


def tool_demonstrations(rows: list[dict], split: str) -> list[dict]:
    """Calculator transcripts in verl's multi-turn SFT schema: each RL row's system and user turns,
    then the call, the tool's reply and ``#### N``; or ``#### N`` at once (``call`` false)."""
    from data_prep.gsm8k import ground_truth, verl_rows
    from verl_gsm8k.tools import config_path, schemas

    tools, demos = schemas(config_path("calculator")), []
    for index, (row, rl) in enumerate(zip(rows, verl_rows(rows, split, tools="calculator"),
                                          strict=True)):  # fmt: skip
        truth = ground_truth(row["answer"])
        call = {
            "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": row["expression"]}},
        }
        turns = [{"role": "assistant", "content": "", "tool_calls": [call]},
                 {"role": "tool", "content": truth}] if row["call"] else []  # fmt: skip
        demos.append({
            "messages": [*rl["prompt"], *turns, {"role": "assistant", "content": f"#### {truth}"}],
            "tools": tools,
            "data_source": rl["data_source"],
            "extra_info": {"split": split, "index": index},
        })  # fmt: skip
    return demos


def write_splits(splits: dict[str, list[dict[str, str]]], out_dir: Path) -> dict[str, Path]:
    """``<split>.jsonl`` and ``warm_start/<split>.parquet`` of each split, renamed together."""
    out_dir, targets = Path(out_dir).expanduser(), {}
    for split, rows in splits.items():
        lines = "".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n"
                        for r in rows).encode()  # fmt: skip
        targets[out_dir / f"{split}.jsonl"] = lambda path, data=lines: path.write_bytes(data)
        if "call" in rows[0]:  # products: transcripts with tool calls, their schema inferred
            writer = parquet_writer(tool_demonstrations(rows, split), None)
        else:
            demos = sft_rows(rows, split)
            for demo, row in zip(demos, rows, strict=True):
                demo["messages"][1]["content"] = row["demonstration"]
            writer = parquet_writer(demos, schema(**SFT_SCHEMA))
        targets[out_dir / "warm_start" / f"{split}.parquet"] = writer
    replace_all(targets)
    return {str(path.relative_to(out_dir)): path for path in targets}


def rates(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if len(values) != len(HABIT_GROUPS) or not all(0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"need {len(HABIT_GROUPS)} numbers in [0, 1] (one per habit group), got {text!r}"
        )
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out-dir",
        required=True,
        type=Path,
        help="where train.jsonl, test.jsonl and warm_start/ are written",
    )
    parser.add_argument(
        "--max-operand",
        type=int,
        choices=range(10),
        default=4,
        metavar="N",
        help="largest operand, 0-9: every a + b with 0 <= a, b <= N (default 4)",
    )
    parser.add_argument(
        "--train-per-pair",
        type=int,
        default=40,
        help="training questions per sum, each a different wording (default 40)",
    )
    parser.add_argument(
        "--test-per-pair",
        type=int,
        default=4,
        help="test questions per sum, in wordings absent from the training file (default 4)",
    )
    parser.add_argument(
        "--marker-rates",
        type=rates,
        default=MARKER_RATES,
        help="per habit "
        "group of writers (the name in the question), the fraction of training "
        "demonstrations that end with the '#### N' line (default 0.9,0.1)",
    )
    parser.add_argument("--seed", type=int, default=0,
                        help="wording choice, marker lines and row order")  # fmt: skip
    parser.add_argument("--task", choices=("sums", "products"), default="sums", help="sums "
                        "(default): a + b, demonstrations with or without the #### line; "
                        "products: a x b of two-digit numbers, demonstrations that call the "
                        "calculator or answer at once (the flags above are the sums')")  # fmt: skip
    parser.add_argument("--products", type=int, nargs=2, default=(2000, 100), metavar=("TRAIN",
                        "TEST"), help="questions per split of --task products (default 2000 "
                        "100), no pair in both")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        splits = (product_splits(*args.products, args.seed) if args.task == "products" else
                  make_splits(args.max_operand, args.train_per_pair, args.test_per_pair,
                              args.seed, args.marker_rates))  # fmt: skip
        paths = write_splits(splits, args.out_dir)
    except (DataPrepError, OSError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{PROG}: {len(splits[Path(name).stem])} rows -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
