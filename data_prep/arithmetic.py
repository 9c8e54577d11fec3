"""A toy task in GSM8K's own format that a tiny model can learn on a CPU: single-digit addition.

    python -m data_prep.arithmetic --out-dir DIR [--max-operand 4] [--seed 0]
    python -m data_prep.gsm8k --source DIR --out-dir DIR/rl      # -> verl's RL parquet

Writes ``train.jsonl`` and ``test.jsonl`` in OpenAI's GSM8K layout (one ``{"question",
"answer"}`` object per line; the answer is a worked solution ending ``#### N``), so everything
after it runs the real path: the GSM8K prompt, verl's parquet schema and ``rewards/gsm8k.py``.

It also writes the warm start's demonstrations, ``warm_start/{train,test}.parquet`` in verl's SFT
schema (``data_prep.sft``): the same training questions, answered by worked solutions of which
only some end with the ``#### N`` line the reward reads. Whether they do is a habit of the
question's writer, not of the sum or the wording: the names of ``HABIT_GROUPS[0]`` end with it in
90% of their answers, the others in 10% (``--marker-rates``), counted exactly per sum. A model
fine-tuned on them knows every sum and the number that goes on the marker line, in every wording,
but mostly stops after ``a + b = s`` for the second group's questions: the reward gives 0 for that,
and RL has a behaviour to learn that the demonstrations did not settle (as GSM8K's own reward
scores a 0.5B model that solves a problem but drops the marker line). The test demonstrations
always carry the marker (they only give the SFT run a validation loss).

    question: Betty has 3 apples and finds 4 more. How many apples does Betty have now?
    answer:   3 + 4 = 7
              #### 7

Every pair ``a + b`` with ``0 <= a, b <= --max-operand`` appears in both splits, each time in a
different wording (template, name, object): no test question appears in the training file, so
the test split measures the task on questions the model has not seen, not on new sums (a tiny
model learns a table of sums, not the addition algorithm). Words come from the tiny model's
tokenizer corpus (``verl_gsm8k.common.tiny_model``), so a question is ~25 tokens.

Why this task: the tiny random Qwen2 learns single-digit sums in about a hundred supervised steps;
two-digit sums (digit by digit, with carries) or picking one of several numbers named in the
question did not come within reach in hundreds of steps. Why the marker rates: a warm start that
only half knows the sums samples almost uniformly over wrong digits, and RL on such a flat
distribution is slow and fragile on this model; a half-learned final line is one clear choice per
answer, the same in every question, which both PPO's critic and GRPO's group baseline can credit
(``docs/learning.md``). Why the habit follows the writer and not the wording: the model does not
copy the sum onto the marker line, it looks it up again from the question, so that lookup must be
demonstrated in every wording; when only 20% of one wording's answers carried the line, RL taught
the line faster than its number, and sums were lost (``docs/learning.md``, "Why sums were lost").
The same seed gives byte-identical files.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from data_prep.gsm8k import DataPrepError, non_negative_int, parquet_writer
from data_prep.sft import MESSAGES_KEY, sft_rows, sft_schema
from verl_gsm8k.common.atomic_io import replace_all

PROG = "data_prep.arithmetic"
NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Alexis", "Tina")
OBJECTS = ("clips", "apples", "dollars", "pages", "eggs", "cookies", "books")
TEMPLATES = (
    "{name} has {a} {obj} and finds {b} more. How many {obj} does {name} have now?",
    "{name} made {a} {obj} in April and {b} {obj} in May. How many {obj} did {name} make "
    "altogether?",
)
MAX_SINGLE_DIGIT = 9
WARM_START_DIR = "warm_start"  # the SFT demonstrations, beside train.jsonl and test.jsonl


# Whose worked answers end with the marker line is a habit of the writer (the name in the
# question), not of the sum or of the wording: every sum, in every wording, is demonstrated with
# the marker line often enough for the model to learn the number that goes on it.
HABIT_GROUPS = (NAMES[0::2], NAMES[1::2])
DEFAULT_MARKER_RATES = (0.9, 0.1)


def worked_answer(a: int, b: int, marker: bool = True) -> str:
    """The worked solution, GSM8K style: the computation, then ``#### <answer>`` (if ``marker``)."""
    computation = f"{a} + {b} = {a + b}"
    return f"{computation}\n#### {a + b}" if marker else computation


def habit_group(name: str) -> int:
    """0 or 1: which group of writers (``HABIT_GROUPS``) the question's name belongs to."""
    return 0 if name in HABIT_GROUPS[0] else 1


def make_splits(
    max_operand: int,
    train_per_pair: int,
    test_per_pair: int,
    seed: int,
    marker_rates: Sequence[float] = DEFAULT_MARKER_RATES,
) -> dict[str, list[dict[str, str]]]:
    """``{"train": [...], "test": [...]}``; each pair gets ``train_per_pair`` wordings in train
    and ``test_per_pair`` other wordings in test. Rows are shuffled with ``seed``. Each row also
    has its ``demonstration``: the worked answer, which in train ends with the marker line in
    exactly ``round(marker_rates[g] x n)`` of the ``n`` questions of each pair whose name is in
    habit group ``g`` (always in test)."""
    if len(marker_rates) != len(HABIT_GROUPS) or not all(0 <= r <= 1 for r in marker_rates):
        raise DataPrepError(
            f"marker rates {list(marker_rates)}: need {len(HABIT_GROUPS)} numbers in [0, 1], "
            "one per habit group"
        )
    wordings = list(itertools.product(TEMPLATES, NAMES, OBJECTS))
    needed = train_per_pair + test_per_pair
    if needed > len(wordings):
        raise DataPrepError(
            f"--train-per-pair + --test-per-pair = {needed}, but only {len(wordings)} distinct "
            "wordings exist per pair"
        )
    rng = random.Random(seed)
    splits: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    for a, b in itertools.product(range(max_operand + 1), repeat=2):
        chosen = rng.sample(wordings, needed)
        train = chosen[:train_per_pair]
        marked: set[int] = set()
        for group, rate in enumerate(marker_rates):
            members = [i for i, (_, name, _) in enumerate(train) if habit_group(name) == group]
            marked.update(rng.sample(members, round(rate * len(members))))
        for i, (template, name, obj) in enumerate(chosen):
            question = template.format(name=name, a=a, b=b, obj=obj)
            marker = i >= train_per_pair or i in marked
            row = {"question": question, "answer": worked_answer(a, b),
                   "demonstration": worked_answer(a, b, marker)}  # fmt: skip
            splits["train" if i < train_per_pair else "test"].append(row)
    for rows in splits.values():
        rng.shuffle(rows)
    return splits


def _jsonl_writer(rows: list[dict[str, str]]):
    lines = (json.dumps({k: row[k] for k in ("question", "answer")}) + "\n" for row in rows)
    data = "".join(lines).encode("utf-8")
    return lambda path: path.write_bytes(data)


def _demonstrations_writer(rows: list[dict[str, str]], split: str):
    records = sft_rows(rows, split)
    for record, row in zip(records, rows, strict=True):
        record[MESSAGES_KEY][1]["content"] = row["demonstration"]
    return parquet_writer(records, sft_schema())


def write_splits(splits: dict[str, list[dict[str, str]]], out_dir: Path) -> dict[str, Path]:
    """``<out_dir>/<split>.jsonl`` and ``<out_dir>/warm_start/<split>.parquet`` for each split,
    all written atomically together; returns the written paths by name."""
    out_dir = Path(out_dir).expanduser()
    targets = {}
    for split, rows in splits.items():
        targets[out_dir / f"{split}.jsonl"] = _jsonl_writer(rows)
        targets[out_dir / WARM_START_DIR / f"{split}.parquet"] = _demonstrations_writer(rows, split)
    replace_all(targets)
    return {str(path.relative_to(out_dir)): path for path in targets}


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated numbers: {text!r}") from None
    if len(rates) != len(HABIT_GROUPS) or not all(0 <= r <= 1 for r in rates):
        raise argparse.ArgumentTypeError(
            f"need {len(HABIT_GROUPS)} numbers in [0, 1] (one per habit group), got {text!r}"
        )
    return rates


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir", required=True, type=Path, help="where train.jsonl and test.jsonl are written"
    )
    parser.add_argument(
        "--max-operand",
        type=non_negative_int,
        default=4,
        help="largest operand: every a + b with 0 <= a, b <= this, (N+1)^2 sums (default 4: "
        f"25 sums; at most {MAX_SINGLE_DIGIT})",
    )
    parser.add_argument(
        "--train-per-pair",
        type=non_negative_int,
        default=40,
        help="training questions per sum, each a different wording (default 40)",
    )
    parser.add_argument(
        "--test-per-pair",
        type=non_negative_int,
        default=4,
        help="test questions per sum, in wordings absent from the training file (default 4)",
    )
    parser.add_argument(
        "--marker-rates",
        type=_rates,
        default=DEFAULT_MARKER_RATES,
        help="per habit group of writers (the name in the question), the fraction of training "
        "demonstrations that end with the '#### N' line, comma-separated (default 0.9,0.1: the "
        "warm start mostly omits it for the second group, which RL must then learn)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="wording choice, marker lines and row order"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_operand > MAX_SINGLE_DIGIT:
        print(f"{PROG}: --max-operand must be at most {MAX_SINGLE_DIGIT}", file=sys.stderr)
        return 2
    try:
        splits = make_splits(
            args.max_operand, args.train_per_pair, args.test_per_pair, args.seed, args.marker_rates
        )
        paths = write_splits(splits, args.out_dir)
    except (DataPrepError, OSError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{PROG}: {len(splits[Path(name).stem])} rows -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
