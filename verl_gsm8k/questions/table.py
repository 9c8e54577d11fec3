"""One row per question (matched by text and ground truth), classified, the first and last
column compared with the exact McNemar test."""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewards.gsm8k import HEDGED, _marker_answer, _tail, compute_score, compute_score_flexible
from verl_gsm8k.common import json_read
from verl_gsm8k.common.run_dir import jsonl

FILTERS = ("learned", "forgotten", "flipping", "never_right", "always_right",
           "format_not_arithmetic")  # fmt: skip


class InputError(ValueError):
    """A missing or unreadable input: one line."""


class NotFiniteError(InputError):
    """A dump with a NaN or infinite score: left out."""


@dataclass
class Cell:
    share: float  # share of the K answers the reward credited
    read: str  # the answer the reward read ("" none, "hedged" several values)
    flexible_right: bool
    responses: list[str] = field(default_factory=list)


@dataclass
class Column:
    label: str
    cells: dict[tuple[str, str], Cell]


def question_of(prompt: str) -> str:
    text = prompt.split("\nuser\n", 1)[-1]
    return text.rsplit("\nassistant", 1)[0].strip()


def _read(text: str) -> str:
    marker = _marker_answer(_tail(text)[0])
    return "hedged" if marker is HEDGED else "" if marker is None else str(marker)


def _review(row: dict[str, Any]) -> dict[str, Any]:
    """An EvalScope review as a validation row, judged by our reward."""
    said = {m["role"]: m["content"] for m in row["messages"]}
    target = row["target"]
    truth = str(target[0] if isinstance(target, list) else target)
    score = compute_score("openai/gsm8k", said["assistant"], truth)["acc"]
    return {"input": f"user\n{said['user']}\nassistant", "output": said["assistant"],
            "gts": truth, "acc": score}  # fmt: skip


def load_validation(path: Path, label: str | None = None) -> Column:
    """A column from verl's ``<step>.jsonl`` or EvalScope's ``gsm8k_main.jsonl``."""
    label = label or (path.parent.name if path.name == "gsm8k_main.jsonl" else path.stem)
    answers: dict[tuple[str, str], list[tuple[float, str]]] = {}
    try:
        for number, row in jsonl(path):
            if isinstance(row, json_read.JsonError):
                raise InputError(str(row))
            try:
                row = _review(row) if "messages" in row else row
                key = (question_of(str(row["input"])), str(row["gts"]))
                acc = float(row.get("acc", row.get("score", 0.0)))
                answers.setdefault(key, []).append((acc, str(row["output"])))
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise InputError(f"{path}: row {number}: not a validation row ({err!r})") from None
            if not math.isfinite(acc):
                raise NotFiniteError(f"{path}: row {number}: score {acc} (the reward gave NaN/inf)")
    except OSError as err:
        raise InputError(f"{path}: unreadable ({err.strerror or err})") from None
    if not answers:
        raise InputError(f"{path}: no rows")
    cells = {key: Cell(sum(a for a, _ in got) / len(got), _read(got[0][1]),
                       any(compute_score_flexible("openai/gsm8k", o, key[1])["acc"] == 1.0
                           for _, o in got), [o for _, o in got])
             for key, got in answers.items()}  # fmt: skip
    return Column(label, cells)


def match(columns: list[Column]) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """The questions in every column, and per column those some other lacks."""
    common = set.intersection(*(set(c.cells) for c in columns))
    unmatched = {c.label: sorted(k[0] for k in c.cells if k not in common) for c in columns}
    return [k for k in columns[0].cells if k in common], {k: v for k, v in unmatched.items() if v}


def classify(shares: list[float], format_not_arithmetic: bool = False) -> list[str]:
    right = [s >= 0.5 for s in shares]
    flips = sum(a != b for a, b in zip(right, right[1:], strict=False))
    tags = [not right[0] and right[-1], right[0] and not right[-1], flips > 1, not any(right),
            all(right), format_not_arithmetic]  # fmt: skip
    return [name for name, on in zip(FILTERS, tags, strict=True) if on]


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value."""
    n = b + c
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n) if n else 1.0


def build(columns: list[Column]) -> dict[str, Any]:
    keys, unmatched = match(columns)
    rows = []
    for index, key in enumerate(keys):
        cells = [c.cells[key] for c in columns]
        shares = [cell.share for cell in cells]
        fna = any(cell.share < 0.5 and cell.flexible_right for cell in cells)
        rows.append({"id": index, "question": key[0], "ground_truth": key[1], "shares": shares,
                     "read": [cell.read for cell in cells],
                     "length": [sum(map(len, c.responses)) / len(c.responses) for c in cells],
                     "change": shares[-1] - shares[0], "tags": classify(shares, fna)})  # fmt: skip
    lost = sum(r["shares"][0] >= 0.5 > r["shares"][-1] for r in rows)
    won = sum(r["shares"][0] < 0.5 <= r["shares"][-1] for r in rows)
    return {
        "columns": [c.label for c in columns],
        "questions": len(rows),
        "accuracy": [sum(r["shares"][i] for r in rows) / max(1, len(rows))
                     for i in range(len(columns))],
        "counts": {name: sum(name in r["tags"] for r in rows) for name in FILTERS},
        "mcnemar": {"right_then_wrong": lost, "wrong_then_right": won,
                    "p_value": mcnemar_exact(lost, won)},
        "unmatched": {k: {"count": len(v), "questions": v} for k, v in unmatched.items()},
        "rows": rows,
    }  # fmt: skip
