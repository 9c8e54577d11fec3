"""One evaluation session, shared by ``eval.sh --model ...`` (cli.py) and ``eval.sh --run ...``
(sweep.py): the data read and copied once, EvalScope and our reward loaded once, every model
evaluated the same way, and the summary's fixed part."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.evaluate.data import load_data, write_data
from verl_gsm8k.evaluate.run import evaluate_model, mode_settings
from verl_gsm8k.evaluate.scoring import load_reward
from verl_gsm8k.evaluate.settings import (
    BENCHMARK,
    PROG,
    REPETITION_PENALTY,
    ModelSpec,
    Settings,
    UsageError,
)
from verl_gsm8k.questions.runs import write_for_evaluation


def read_rows(data: str, modes: list[str]) -> dict[str, list[dict]]:
    rows = load_data(data)
    if "evalscope" in modes and len(rows.get("train") or []) < 4:
        raise UsageError(
            f"--data {data}: evalscope mode needs >= 4 train rows for its 4-shot examples"
        )
    return rows


@dataclass
class Session:
    settings: Settings
    data_source: str
    rows: dict[str, list[dict]]
    data_dir: Path
    compute_score: Any
    ground_truth: Any
    version: str
    benchmark_version: str

    @classmethod
    def open(cls, settings: Settings, data_source: str, rows: dict[str, list[dict]]) -> Session:
        import evalscope
        from evalscope.api.registry import BENCHMARK_REGISTRY

        from data_prep.gsm8k import ground_truth

        return cls(
            settings, data_source, rows, write_data(rows, settings.out / "data"), load_reward(),
            ground_truth, evalscope.__version__, BENCHMARK_REGISTRY[BENCHMARK].evaluation_version,
        )  # fmt: skip

    def evaluate(self, spec: ModelSpec) -> list[dict]:
        return evaluate_model(spec, self.settings, self.data_dir, self.rows, self.compute_score,
                              self.ground_truth, self.version)  # fmt: skip

    def summary(self, baseline: str, results: list[dict], seconds: float) -> dict[str, Any]:
        s = self.settings
        return {
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "evalscope_version": self.version,
            "benchmark_version": self.benchmark_version,
            "baseline": baseline,
            "data": {
                "source": self.data_source,
                "dataset_dir": os.path.relpath(self.data_dir, s.out),
                "n_test": len(self.rows["test"]),
                "n_train": len(self.rows.get("train") or []),
            },
            "limit": s.limit,
            "generation": {
                "max_tokens": s.max_tokens,
                "max_tokens_from": s.max_tokens_from,
                "temperature": s.temperature,
                "do_sample": s.repeats > 1,
                "samples_per_question": s.repeats,
                **({"top_p": s.top_p, "top_k": s.top_k} if s.repeats > 1 else {}),
                "repetition_penalty": REPETITION_PENALTY,
                "batch_size": s.batch_size,
            },
            "modes": {
                m: {k: v for k, v in mode_settings(m, s).items() if k != "dataset_args"}
                for m in s.modes
            },
            "results": results,
            "seconds": round(seconds, 1),
        }


def write_comparison(out: Path, summary: dict, markdown: str) -> None:
    """comparison.json and comparison.md, then questions/questions.html: every model's answers
    question by question (verl_gsm8k/questions; a page that cannot be written is one warning,
    and none is tried when every evaluation failed)."""
    write_atomic(out / "comparison.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_atomic(out / "comparison.md", markdown)
    if not any(r.get("error") is None for r in summary.get("results", [])):
        return  # every evaluation failed, each said in its own line: no answer to show
    page, issue = write_for_evaluation(out, summary.get("baseline"))
    if issue:
        print(f"{PROG}: warning: {issue}", file=sys.stderr)
    if page:
        print(f"{PROG}: which questions changed -> {page}")


def exit_interrupted(stop: BaseException, what: str) -> None:
    """Every server was stopped while the exception unwound its ``with`` block. Exit now,
    without waiting for EvalScope's worker threads to give up on their requests."""
    code = stop.code if isinstance(stop, SystemExit) and isinstance(stop.code, int) else 130
    print(f"{PROG}: interrupted; servers stopped, {what}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
