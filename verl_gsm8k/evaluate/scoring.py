"""EvalScope's outputs read and scored: responses, prompts, our reward's re-score with pass@k,
EvalScope's report and reviews, deltas against the baseline. No EvalScope import."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.evaluate.settings import BENCHMARK, DATA_SOURCE, EvalError


def _text(content: Any) -> str:
    """A message's content: a string, or a list of text parts."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _last(record: dict, role: str) -> Any:
    said = [m for m in record.get("messages") or [] if m.get("role") == role]
    return said[-1].get("content") if said else ""


def response_text(record: dict) -> str:
    """The answer in one line of EvalScope's predictions (``model_output.choices[0]``, else the
    conversation's last assistant turn)."""
    choices = (record.get("model_output") or {}).get("choices") or []
    content = choices[0].get("message", {}).get("content") if choices else None
    return _text(_last(record, "assistant") if content is None else content)


def user_prompt(record: dict) -> str:
    return _text(_last(record, "user"))


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        lines = [(n, line) for n, line in enumerate(handle, 1) if line.strip()]
    try:
        return [json_read.parse(line, f"{path}: line {n}") for n, line in lines]
    except json_read.JsonError as err:
        raise EvalError(str(err)) from None


def match_row(record: dict, rows: list[dict]) -> dict | None:
    """The test row a prediction answers: by its index, checked against the prompt's text."""
    prompt, index = user_prompt(record), record.get("index")
    if isinstance(index, int) and 0 <= index < len(rows) and rows[index]["question"] in prompt:
        return rows[index]
    hits = [row for row in rows if row["question"] in prompt]
    return max(hits, key=lambda r: len(r["question"])) if hits else None


def pass_at_k(answers: list[float], k: int) -> float:
    """Unbiased pass@k of one question, ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021)."""
    n, c = len(answers), sum(1 for a in answers if a > 0)
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} answers, got {n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def rescore(predictions: Path, rows: list[dict], k: int = 1) -> dict:
    """EvalScope's saved answers scored by our reward, grouped by the dataset row they answer
    (two questions of the same text stay two): accuracy (mean@k), format rate, pass@k over the
    questions with at least k answers; the others are ``short_questions``, named on stderr."""
    from data_prep.gsm8k import ground_truth
    from rewards.gsm8k import compute_score

    scores: dict[int, dict] = {}
    by_row: dict[int, list[float]] = {}
    position = {id(row): i for i, row in enumerate(rows)}
    unmatched = 0
    for record in read_jsonl(predictions):
        row = match_row(record, rows)
        if row is None:
            unmatched += 1
            continue
        truth = ground_truth(row["answer"])
        score = compute_score(DATA_SOURCE, response_text(record), truth)
        scores[int(record.get("index", len(scores)))] = score
        by_row.setdefault(position[id(row)], []).append(score["acc"])
    n = len(scores)
    short = sorted(i for i, a in by_row.items() if len(a) < k)
    if short:
        print(f"warning: {predictions}: {len(short)} question(s) with fewer than {k} scored "
              f"answers (rows {short[:10]}) left out of pass@{k}", file=sys.stderr)  # fmt: skip
    full = [pass_at_k(a, k) for a in by_row.values() if len(a) >= k]
    return {
        "n": n, "questions": len(by_row), "unmatched": unmatched,
        "accuracy": sum(s["acc"] for s in scores.values()) / n if n else None,
        "format_rate": sum(s["format"] for s in scores.values()) / n if n else None,
        "pass_at_k": sum(full) / len(full) if full else None,
        "short_questions": short, "per_index": scores,
    }  # fmt: skip


def read_report(work_dir: Path, label: str) -> dict:
    """EvalScope's ``reports/<model>/gsm8k.json``: the mean's score (0..1), the questions
    scored, pass@n for each n it reports (several answers a question), errored requests."""
    path = work_dir / "reports" / label / f"{BENCHMARK}.json"
    try:
        report = json_read.read(path)
    except (OSError, json_read.JsonError) as err:
        raise EvalError(f"EvalScope wrote no readable report at {path} ({err})") from None
    metrics = (report.get("metrics") if isinstance(report, dict) else None) or []
    if not metrics:
        raise EvalError(f"EvalScope's report {path} has no metrics")
    means = [m for m in metrics if (m.get("identity") or {}).get("aggregation") in (None, "mean")]
    passes = {
        int(((m.get("identity") or {}).get("dimensions") or {}).get("k", 0)): m
        for m in metrics
        if (m.get("identity") or {}).get("aggregation") == "pass_at_k"
    }
    metric = (means or metrics)[0]
    answers = int(metric.get("num") or report.get("num") or 0)
    return {
        "path": path,
        "score": float(metric["score"]),
        # questions: pass@1 counts each once; without it every answer is a question
        "n": int(passes[1].get("num") or answers) if 1 in passes else answers,
        "pass_at_k": {k: float(m["score"]) for k, m in passes.items()},
        "errored": int((report.get("execution_summary") or {}).get("errored") or 0),
    }


def review_scores(reviews: Path) -> dict[int, dict]:
    """Each answer's EvalScope score, extracted answer and target, by index ({} without file)."""
    out: dict[int, dict] = {}
    for record in read_jsonl(reviews) if reviews.is_file() else []:
        score = (record.get("sample_score") or {}).get("score") or {}
        value = score.get("value") or {}
        main = score.get("main_score_name") or next(iter(value), None)
        out[int(record.get("index", len(out)))] = {
            "score": value.get(main) if main else None,
            "extracted": score.get("extracted_prediction"),
            "target": record.get("target"),
        }
    return out


def add_deltas(results: list[dict], baseline: str) -> None:
    """``delta_vs_baseline`` (and our reward's) in accuracy 0..1, against the same mode only."""
    base = {r["mode"]: r for r in results if r["model"] == baseline and r.get("error") is None}
    for r in results:
        ref = base.get(r["mode"]) if r["model"] != baseline else None
        for key, delta in (("accuracy", "delta_vs_baseline"),
                           ("our_reward_accuracy", "our_reward_delta_vs_baseline")):  # fmt: skip
            ok = ref is not None and r.get(key) is not None and ref.get(key) is not None
            r[delta] = round(r[key] - ref[key], 6) if ok else None
