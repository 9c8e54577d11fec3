"""EvalScope's outputs read and scored: our reward's re-score and pass@k, EvalScope's report and
reviews, deltas against the baseline."""

import math
import sys
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common.run_dir import jsonl
from verl_gsm8k.evaluate.settings import BENCHMARK, DATA_SOURCE, EvalError


def said(record: dict, role: str) -> str:
    """A prediction's last ``role`` turn."""
    choices = (record.get("model_output") or {}).get("choices") or []
    content = choices[0].get("message", {}).get("content") if choices else None
    if role != "assistant" or content is None:
        turns = [m for m in record.get("messages") or [] if m.get("role") == role]
        content = turns[-1].get("content") if turns else ""
    if isinstance(content, list):  # text parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def read_jsonl(path: Path) -> list[dict]:
    rows = [row for _, row in jsonl(path)]
    if bad := next((r for r in rows if isinstance(r, json_read.JsonError)), None):
        raise EvalError(str(bad))
    return rows


def match_row(record: dict, rows: list[dict]) -> dict | None:
    """The test row a prediction answers: by index, checked against the prompt."""
    prompt, index = said(record, "user"), record.get("index")
    if isinstance(index, int) and 0 <= index < len(rows) and rows[index]["question"] in prompt:
        return rows[index]
    hits = [row for row in rows if row["question"] in prompt]
    return max(hits, key=lambda r: len(r["question"])) if hits else None


def pass_at_k(answers: list[float], k: int) -> float:
    """Unbiased pass@k of one question (Chen et al. 2021)."""
    n, c = len(answers), sum(1 for a in answers if a > 0)
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} answers, got {n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def rescore(predictions: Path, rows: list[dict], k: int = 1) -> tuple[dict, dict[int, dict]]:
    """EvalScope's answers scored by our reward: the ``our_reward_*`` fields, scores by index."""
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
        score = compute_score(DATA_SOURCE, said(record, "assistant"), ground_truth(row["answer"]))
        scores[int(record.get("index", len(scores)))] = score
        by_row.setdefault(position[id(row)], []).append(score["acc"])
    n, short = len(scores), sorted(i for i, a in by_row.items() if len(a) < k)
    fields: dict[str, Any] = {
        "our_reward_accuracy": sum(s["acc"] for s in scores.values()) / n if n else None,
        "our_reward_format_rate": sum(s["format"] for s in scores.values()) / n if n else None,
        "our_reward_n": len(by_row),
    }
    if k > 1:
        full = [pass_at_k(a, k) for a in by_row.values() if len(a) >= k]
        fields["our_reward_pass_at_k"] = sum(full) / len(full) if full else None
    if short:
        fields["our_reward_short_questions"] = short
        print(f"warning: {predictions}: {len(short)} question(s) with fewer than {k} scored "
              f"answers (rows {short[:10]}) left out of pass@{k}", file=sys.stderr)  # fmt: skip
    if unmatched:
        fields["our_reward_unmatched"] = unmatched
    return fields, scores


def read_report(work_dir: Path, label: str) -> dict:
    """``reports/<model>/gsm8k.json``: the mean, questions, pass@n by n, errored."""
    path = work_dir / "reports" / label / f"{BENCHMARK}.json"
    report = json_read.read(path)
    metrics = report.get("metrics") if isinstance(report, dict) else None
    if not metrics:
        raise EvalError(f"EvalScope's report {path} has no metrics")
    pairs = [(m, (m.get("identity") or {}).get("aggregation")) for m in metrics]
    metric = next((m for m, kind in pairs if kind in (None, "mean")), metrics[0])
    passes = {int(m["identity"].get("dimensions", {}).get("k", 0)): m
              for m, kind in pairs if kind == "pass_at_k"}  # fmt: skip
    answers = int(metric.get("num") or report.get("num") or 0)
    return {
        "path": path, "score": float(metric["score"]),
        "n": int(passes[1].get("num") or answers) if 1 in passes else answers,
        "pass_at_k": {k: float(m["score"]) for k, m in passes.items()},
        "errored": int((report.get("execution_summary") or {}).get("errored") or 0),
    }  # fmt: skip


def review_scores(reviews: Path) -> dict[int, dict]:
    """Each answer's EvalScope score, extracted answer and target, by index."""
    out: dict[int, dict] = {}
    for record in read_jsonl(reviews) if reviews.is_file() else []:
        score = (record.get("sample_score") or {}).get("score") or {}
        value = score.get("value") or {}
        main = score.get("main_score_name") or next(iter(value), None)
        found = {"extracted": score.get("extracted_prediction"), "target": record.get("target")}
        out[int(record.get("index", len(out)))] = {"score": value.get(main), **found}
    return out


def add_deltas(results: list[dict], baseline: str) -> None:
    """``delta_vs_baseline`` (and our reward's), against the same mode only."""
    base = {r["mode"]: r for r in results if r["model"] == baseline and r.get("error") is None}
    for r in results:
        ref = base.get(r["mode"]) if r["model"] != baseline else None
        for key, delta in (("accuracy", "delta_vs_baseline"),
                           ("our_reward_accuracy", "our_reward_delta_vs_baseline")):  # fmt: skip
            ok = ref is not None and r.get(key) is not None and ref.get(key) is not None
            r[delta] = round(r[key] - ref[key], 6) if ok else None
