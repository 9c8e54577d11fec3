"""Per-question table from verl validation dumps: matching, classification, McNemar."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rewards.gsm8k import HEDGED, _marker_answer, _tail, compute_score, compute_score_flexible
from verl_gsm8k.common import json_read

FILTERS = (
    "learned",
    "forgotten",
    "flipping",
    "never_right",
    "always_right",
    "format_not_arithmetic",
)


class InputError(ValueError):
    """A missing or unreadable input: its message is the one line the CLI prints."""


class NotFiniteError(InputError):
    """A dump holding a NaN or infinite score (verl writes a reward's NaN as JSON's ``NaN``): that
    step tells nothing about which answers were right, so it is left out (runs.load_columns)."""


@dataclass
class Cell:
    share: float  # share of the K answers the reward credited (1 or 0 when K == 1)
    read: str  # the answer the reward read ("" when none, "hedged" when several values)
    flexible_right: bool  # right when read flexibly (boxed, "answer is", last number)
    responses: list[str] = field(default_factory=list)


@dataclass
class Column:
    label: str
    cells: dict[tuple[str, str], Cell]


def _read_answer(text: str) -> str:
    """The answer the reward read: the number after the last marker, "hedged" when it holds
    several values, "" when there is none (rewards/gsm8k.py's own reading)."""
    tail, _ = _tail(text)
    marker = _marker_answer(tail)
    if marker is HEDGED:
        return "hedged"
    return "" if marker is None else str(marker)


def _question(prompt: str) -> str:
    """The user turn of a chat prompt as verl dumps it (``system ... user <q> assistant``)."""
    text = prompt
    if "\nuser\n" in text:
        text = text.split("\nuser\n", 1)[1]
    return text.rsplit("\nassistant", 1)[0].strip()


def load_validation(path: Path, label: str | None = None) -> Column:
    """One column from verl's ``<step>.jsonl``; InputError (one line) if missing or unreadable."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if _is_evalscope(path):
        return _load_evalscope(path, label)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from exc
    rows = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json_read.parse(line, f"{path}: line {number}"))
            except json_read.JsonError as exc:
                raise InputError(str(exc)) from None
    return _column(path, rows, label or path.stem)


def _column(path: Path, rows: list, label: str) -> Column:
    grouped: dict[tuple[str, str], list[tuple[float, str, bool, str]]] = {}
    for number, row in enumerate(rows, 1):
        try:
            key = (_question(str(row["input"])), str(row["gts"]))
            output = str(row["output"])
            acc = float(row.get("acc", row.get("score", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"{path}: row {number}: not a validation row ({exc})") from exc
        if not math.isfinite(acc):
            raise NotFiniteError(f"{path}: row {number}: score {acc} (the reward returned NaN/inf)")
        flexible = compute_score_flexible("openai/gsm8k", output, key[1])["acc"] == 1.0
        grouped.setdefault(key, []).append((acc, _read_answer(output), flexible, output))
    if not grouped:
        raise InputError(f"{path}: no rows")
    cells = {
        key: Cell(
            share=sum(a[0] for a in answers) / len(answers),
            read=answers[0][1],
            flexible_right=any(a[2] for a in answers),
            responses=[a[3] for a in answers],
        )
        for key, answers in grouped.items()
    }
    return Column(label, cells)


def _is_evalscope(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as handle:
            return '"messages"' in handle.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from exc


def _load_evalscope(path: Path, label: str | None) -> Column:
    """One column from EvalScope's ``reviews/<model>/gsm8k_main.jsonl``: the question is the last
    user message, the ground truth ``target[0]``, each generation (K with sampling) one response,
    judged by our reward (rewards/gsm8k.py compute_score), as verl's validation is."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json_read.parse(line, f"{path}: line {number}")
            messages = record["messages"]
            user = [m["content"] for m in messages if m["role"] == "user"][-1]
            answer = [m["content"] for m in messages if m["role"] == "assistant"][-1]
            target = record["target"]
            truth = str(target[0] if isinstance(target, list) else target)
        except (json_read.JsonError, KeyError, IndexError, TypeError) as exc:
            raise InputError(f"{path}: line {number}: not an EvalScope review ({exc})") from exc
        acc = compute_score("openai/gsm8k", answer, truth)["acc"]
        rows.append(
            {"input": f"user\n{user}\nassistant", "output": answer, "gts": truth, "acc": acc}
        )
    return _column(path, rows, label or path.parent.name)


def match(columns: list[Column]) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """Questions present in every column (in the first column's order), and per column the
    questions (text) it has that some other column lacks."""
    common = set(columns[0].cells)
    for column in columns[1:]:
        common &= set(column.cells)
    keys = [k for k in columns[0].cells if k in common]
    unmatched = {c.label: sorted(k[0] for k in c.cells if k not in common) for c in columns}
    return keys, {label: qs for label, qs in unmatched.items() if qs}


def classify(shares: list[float], format_not_arithmetic: bool = False) -> list[str]:
    """The filters a question's row of right-shares falls in (right = share >= 0.5)."""
    right = [s >= 0.5 for s in shares]
    tags = []
    if not right[0] and right[-1]:
        tags.append("learned")
    if right[0] and not right[-1]:
        tags.append("forgotten")
    if sum(a != b for a, b in zip(right, right[1:], strict=False)) > 1:
        tags.append("flipping")
    if not any(right):
        tags.append("never_right")
    if all(right):
        tags.append("always_right")
    if format_not_arithmetic:
        tags.append("format_not_arithmetic")
    return tags


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: binomial(b + c, 1/2) on the discordant pairs."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def build(columns: list[Column]) -> dict:
    """The per-question table (what summary.json holds and the page shows)."""
    keys, unmatched = match(columns)
    rows = []
    for index, key in enumerate(keys):
        cells = [c.cells[key] for c in columns]
        shares = [cell.share for cell in cells]
        fna = any(cell.share < 0.5 and cell.flexible_right for cell in cells)
        rows.append(
            {
                "id": index,
                "question": key[0],
                "ground_truth": key[1],
                "shares": shares,
                "read": [cell.read for cell in cells],
                "length": [
                    sum(len(r) for r in cell.responses) / max(1, len(cell.responses))
                    for cell in cells
                ],
                "change": shares[-1] - shares[0],
                "tags": classify(shares, fna),
            }
        )
    b = sum(1 for r in rows if r["shares"][0] >= 0.5 and r["shares"][-1] < 0.5)
    c = sum(1 for r in rows if r["shares"][0] < 0.5 and r["shares"][-1] >= 0.5)
    return {
        "columns": [c.label for c in columns],
        "questions": len(rows),
        "accuracy": [
            sum(r["shares"][i] for r in rows) / max(1, len(rows)) for i in range(len(columns))
        ],
        "counts": {name: sum(name in r["tags"] for r in rows) for name in FILTERS},
        "mcnemar": {"right_then_wrong": b, "wrong_then_right": c, "p_value": mcnemar_exact(b, c)},
        "unmatched": {
            label: {"count": len(qs), "questions": qs} for label, qs in unmatched.items()
        },
        "rows": rows,
    }
