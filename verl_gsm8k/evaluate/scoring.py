"""Read EvalScope's outputs and score them: responses, prompts, re-scoring with our reward,
EvalScope's report and reviews, deltas against the baseline. Pure; tested without EvalScope.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.evaluate.settings import BENCHMARK, DATA_SOURCE, REWARD_FILE, EvalError, UsageError


def response_text(record: dict) -> str:
    """The model's answer in one record of EvalScope's ``predictions/<model>/gsm8k_main.jsonl``:
    ``model_output.choices[0].message.content`` (a string, or a list of content parts)."""
    output = record.get("model_output") or {}
    choices = output.get("choices") or []
    content: Any = choices[0].get("message", {}).get("content") if choices else None
    if content is None:  # fall back on the last assistant message of the conversation
        assistants = [m for m in record.get("messages") or [] if m.get("role") == "assistant"]
        content = assistants[-1].get("content") if assistants else ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def user_prompt(record: dict) -> str:
    users = [m for m in record.get("messages") or [] if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        lines = [(n, line) for n, line in enumerate(handle, 1) if line.strip()]
    try:
        return [json_read.parse(line, f"{path}: line {n}") for n, line in lines]
    except json_read.JsonError as err:
        raise EvalError(str(err)) from None


def load_reward(path: Path = REWARD_FILE):
    """Our training reward, loaded by file path (it is standard library only)."""
    spec = importlib.util.spec_from_file_location("gsm8k_reward_for_eval", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot load the reward function from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def match_row(record: dict, rows: list[dict]) -> dict | None:
    """The test row a prediction answers: by its index, checked against the prompt's text."""
    prompt = user_prompt(record)
    index = record.get("index")
    if isinstance(index, int) and 0 <= index < len(rows) and rows[index]["question"] in prompt:
        return rows[index]
    hits = [row for row in rows if row["question"] in prompt]
    return max(hits, key=lambda r: len(r["question"])) if hits else None


def pass_at_k(answers: list[float], k: int) -> float:
    """The unbiased pass@k of one question: ``1 - C(n-c, k) / C(n, k)`` with ``n`` the answers
    scored and ``c`` the right ones (Chen et al. 2021); needs ``n >= k``."""
    n, c = len(answers), sum(1 for a in answers if a > 0)
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} answers, got {n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def rescore(predictions: Path, rows: list[dict], compute_score, ground_truth, k: int = 1) -> dict:
    """Re-score EvalScope's saved predictions with our reward: accuracy (the mean over every
    answer: mean@k when several were sampled per question), format rate, answers ``n``,
    ``questions``, ``pass_at_k`` (the mean over questions of the unbiased pass@k, from the
    answers actually scored) and ``short_questions`` (row positions of questions with fewer than
    ``k`` scored answers: left out of pass@k, and named on stderr). Answers are grouped by the
    dataset row they match, so two questions with the same text stay two questions."""
    scores: dict[int, dict] = {}
    by_question: dict[int, list[float]] = {}
    position = {id(row): i for i, row in enumerate(rows)}
    unmatched = 0
    for record in read_jsonl(predictions):
        row = match_row(record, rows)
        if row is None:
            unmatched += 1
            continue
        result = compute_score(
            data_source=DATA_SOURCE,
            solution_str=response_text(record),
            ground_truth=ground_truth(row["answer"]),
        )
        scores[int(record.get("index", len(scores)))] = result
        by_question.setdefault(position[id(row)], []).append(result["acc"])
    n, questions = len(scores), len(by_question)
    short = sorted(i for i, a in by_question.items() if len(a) < k)
    if short:
        print(
            f"warning: {predictions}: {len(short)} question(s) with fewer than {k} scored "
            f"answers (rows {short[:10]}) left out of pass@{k}",
            file=sys.stderr,
        )
    full = [pass_at_k(a, k) for i, a in by_question.items() if len(a) >= k]
    return {
        "n": n,
        "questions": questions,
        "unmatched": unmatched,
        "accuracy": sum(s["acc"] for s in scores.values()) / n if n else None,
        "format_rate": sum(s["format"] for s in scores.values()) / n if n else None,
        "pass_at_k": sum(full) / len(full) if full else None,
        "short_questions": short,
        "per_index": scores,
    }


def read_report(work_dir: Path, label: str) -> dict:
    """EvalScope's ``reports/<model_id>/gsm8k.json``: primary metric score (0..1) and n."""
    path = work_dir / "reports" / label / f"{BENCHMARK}.json"
    if not path.is_file():
        raise EvalError(f"EvalScope wrote no report at {path}")
    try:
        report = json_read.read(path)
    except json_read.JsonError as err:
        raise EvalError(str(err)) from None
    metrics = (report.get("metrics") if isinstance(report, dict) else None) or []
    if not metrics:
        raise EvalError(f"EvalScope's report {path} has no metrics")
    # the mean first; with several answers per question EvalScope adds pass@n for n <= k
    means = [m for m in metrics if (m.get("identity") or {}).get("aggregation") in (None, "mean")]
    metric = means[0] if means else metrics[0]
    pass_at: dict[int, dict] = {}
    for m in metrics:
        identity = m.get("identity") or {}
        if identity.get("aggregation") == "pass_at_k":
            pass_at[int((identity.get("dimensions") or {}).get("k", 0))] = m
    execution = report.get("execution_summary") or {}
    identity = metric.get("identity") or {}
    answers = int(metric.get("num") or report.get("num") or 0)
    return {
        "path": path,
        "metric": identity.get("name") or metric.get("name"),
        "score": float(metric["score"]),
        # questions: pass@1 counts each once; without it every answer is a question
        "n": int(pass_at[1].get("num") or answers) if 1 in pass_at else answers,
        "pass_at_k": {k: float(m["score"]) for k, m in pass_at.items()},
        "errored": int(execution.get("errored") or 0),
    }


def review_scores(reviews: Path) -> dict[int, dict]:
    """Per-sample EvalScope scores from ``reviews/<model>/gsm8k_main.jsonl``."""
    out: dict[int, dict] = {}
    for record in read_jsonl(reviews):
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
    """``delta_vs_baseline`` (and for our reward) in accuracy points 0..1, same mode only."""
    base = {r["mode"]: r for r in results if r["model"] == baseline and r.get("error") is None}
    for r in results:
        ref = base.get(r["mode"])
        for key, delta in (
            ("accuracy", "delta_vs_baseline"),
            ("our_reward_accuracy", "our_reward_delta_vs_baseline"),
        ):
            ok = ref is not None and r["model"] != baseline
            ok = ok and r.get(key) is not None and ref.get(key) is not None
            r[delta] = round(r[key] - ref[key], 6) if ok else None
