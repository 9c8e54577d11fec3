"""One evaluation session, for ``eval.sh --model ...`` and ``eval.sh --run ...`` alike: the data
copied once, every model evaluated the same way in every mode (EvalScope's run, its outputs read
back and checked, our reward's re-score, the samples page), comparison.md/.json written. A failed
evaluation is a row with ``error`` set; the others go on."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.evaluate.data import write_data
from verl_gsm8k.evaluate.render import pct, render_samples
from verl_gsm8k.evaluate.scoring import read_jsonl, read_report, rescore, review_scores
from verl_gsm8k.evaluate.server import served
from verl_gsm8k.evaluate.settings import (
    BENCHMARK,
    PROG,
    REPETITION_PENALTY,
    SUBSET,
    EvalError,
    ModelSpec,
    Settings,
)
from verl_gsm8k.questions.runs import write_for_evaluation


@functools.cache
def benchmark() -> Any:
    """EvalScope's gsm8k benchmark (imported on first use: the refusals need no EvalScope)."""
    from evalscope.api.registry import BENCHMARK_REGISTRY

    return BENCHMARK_REGISTRY[BENCHMARK]


def mode_settings(mode: str, settings: Settings) -> dict[str, Any]:
    """What a mode means, for the tables: shots, prompt, scorer, what it compares with."""
    from data_prep.gsm8k import PROMPT_STYLES

    meta = benchmark()
    metric = ", ".join(m if isinstance(m, str) else next(iter(m), "?") for m in meta.metric_list)
    scorer = f"EvalScope {metric or 'accuracy'} (Math-Verify)"
    if mode == "training":
        return {"few_shot": 0, "prompt_template": PROMPT_STYLES["hash"], "scorer": scorer
                + " + our reward rewards/gsm8k.py:compute_score (number after the last ####)",
                "comparable_to": settings.comparable_to()}  # fmt: skip
    return {"few_shot": meta.few_shot_num, "prompt_template": meta.prompt_template,
            "scorer": scorer, "comparable_to": "Comparable to published EvalScope gsm8k numbers "
            "of the same release."}  # fmt: skip


def run_evalscope(spec: ModelSpec, mode: str, s: Settings, data_dir: Path, url: str | None,
                  served_name: str | None, work_dir: Path) -> None:  # fmt: skip
    from evalscope import TaskConfig, run_task

    dataset: dict[str, Any] = {"dataset_id": str(data_dir)}
    if mode == "training":
        info = mode_settings(mode, s)
        dataset.update(few_shot_num=0, prompt_template=info["prompt_template"])
    penalty = {"repetition_penalty": REPETITION_PENALTY}
    generation: dict[str, Any] = {"do_sample": False, "max_tokens": s.max_tokens,
                                  "extra_body": penalty}  # fmt: skip
    repeats: dict[str, Any] = {}
    if s.repeats > 1:  # EvalScope repeats each question: mean@k the headline, pass@n beside it
        from evalscope.api.metric.semantics import MetricSelector

        # top_p/top_k sent as verl's rollout (1.0, -1: off): left out, a server and transformers
        # take the model's generation_config.json (Qwen2.5-Instruct: 0.8, 20); transformers'
        # "off" for top_k is 0
        top_k = s.top_k if s.top_k > 0 or url else 0
        generation.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=top_k)
        mean = MetricSelector(name="accuracy", aggregation="mean")
        dataset.update(aggregation="mean_and_pass_at_k", primary_metric=mean)
        repeats = {"repeats": s.repeats}
    if url:
        generation.setdefault("temperature", 0.0)
        model = {"model": served_name, "eval_type": "openai_api", "api_url": url,
                 "api_key": s.api_key}  # fmt: skip
    else:
        model = {"model": spec.path, "eval_type": "llm_ckpt", "model_args": {"precision": s.dtype}}
    run_task(TaskConfig(
        model_id=spec.label, datasets=[BENCHMARK], dataset_args={BENCHMARK: dataset},
        generation_config=generation, eval_batch_size=s.batch_size or (64 if url else 8),
        limit=s.limit, work_dir=str(work_dir), no_timestamp=True, **repeats, **model,
    ))  # fmt: skip


@contextlib.contextmanager
def console_to(log: Path) -> Iterator[None]:
    """File descriptors 1 and 2 (EvalScope's logger, progress bars, the libraries' warnings) to
    ``log``, with an exception's traceback; the exception goes on to the caller."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with log.open("ab") as handle:
            os.dup2(handle.fileno(), 1)
            os.dup2(handle.fileno(), 2)
            try:
                yield
            except Exception:
                traceback.print_exc()
                raise
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def last_line(err: Exception) -> str:
    """A failure in one line: ours as is, any other as its type and last line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if isinstance(err, EvalError):
        return str(err)
    return f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__


@dataclass
class Session:
    settings: Settings
    rows: dict[str, list[dict]]
    data_dir: Path
    version: str

    @classmethod
    def open(cls, settings: Settings, rows: dict[str, list[dict]]) -> Session:
        data_dir = write_data(rows, settings.out / "data")
        return cls(settings, rows, data_dir, metadata.version("evalscope"))

    def row(self, spec: ModelSpec, backend: str, mode: str, error: str | None = None) -> dict:
        """A comparison row's identity; a failed one says why, in one line on stderr too."""
        if error is not None:
            print(f"{PROG}: {spec.label} / {mode} failed: {error}", file=sys.stderr)
        return {"model": spec.label, "model_source": spec.source, "model_path": spec.path,
                "backend": backend, "mode": mode, "accuracy": None, "n": 0,
                "evalscope_version": self.version, "error": error}  # fmt: skip

    def evaluate(self, spec: ModelSpec) -> list[dict]:
        """Every mode of one model (a local one served by vLLM first, with that backend)."""
        s, rows = self.settings, []
        backend = "api" if spec.api_url else s.backend
        try:
            with contextlib.ExitStack() as stack:
                url = spec.api_url
                if backend == "vllm":
                    url = stack.enter_context(served(spec, s))
                for mode in s.modes:
                    log = s.out / "logs" / f"evalscope-{spec.label}-{mode}.log"
                    try:
                        rows.append(self.evaluate_one(spec, mode, backend, url, log))
                    except Exception as err:  # one failed evaluation must not lose the others
                        rows.append(self.row(spec, backend, mode,
                                             f"{last_line(err)} (full log: {log})"))  # fmt: skip
        except EvalError as err:  # the server did not start
            return [self.row(spec, backend, mode, str(err)) for mode in s.modes]
        return rows

    def evaluate_one(self, spec: ModelSpec, mode: str, backend: str, url: str | None,
                     log: Path) -> dict:  # fmt: skip
        s, out, test = self.settings, self.settings.out, self.rows["test"]
        work = out / "evalscope" / spec.label / mode
        shutil.rmtree(work, ignore_errors=True)
        info = mode_settings(mode, s)
        generation = {**s.generation(), "batch_size": s.batch_size or (64 if url else 8)}
        if backend == "transformers":
            generation["dtype"] = s.dtype
        start = time.perf_counter()
        print(f"{PROG}: evaluating {spec.label} in {mode} mode ({backend}); log: {log}", flush=True)
        with console_to(log):
            name = spec.source if spec.api_url else spec.label
            run_evalscope(spec, mode, s, self.data_dir, url, name, work)
        report = read_report(work, spec.label)
        predictions = work / "predictions" / spec.label / f"{BENCHMARK}_{SUBSET}.jsonl"
        if not predictions.is_file():
            raise EvalError(f"EvalScope wrote no predictions at {predictions}")
        expected = min(s.limit or len(test), len(test))
        if report["n"] != expected:
            raise EvalError(
                f"EvalScope scored {report['n']} questions but {self.data_dir} has {expected} to "
                "score (a stale datasets cache of another directory with the same name?)"
            )
        reviews = review_scores(work / "reviews" / spec.label / f"{BENCHMARK}_{SUBSET}.jsonl")
        scored = [r["score"] for r in reviews.values() if r["score"] is not None]
        row = {**self.row(spec, backend, mode), "accuracy": report["score"], "n": report["n"],
               "correct": round(sum(scored)) if scored and s.repeats == 1 else None,
               "errored": report["errored"], "our_reward_accuracy": None,
               "our_reward_format_rate": None, "few_shot": info["few_shot"],
               "prompt_template": info["prompt_template"], "generation": generation,
               "work_dir": os.path.relpath(work, out),
               "report": os.path.relpath(report["path"], out),
               "predictions": os.path.relpath(predictions, out)}  # fmt: skip
        if s.repeats > 1:  # accuracy is mean@k; pass@k: a question with any right answer
            row["pass_at_k"] = report["pass_at_k"].get(s.repeats)
        ours = None
        if mode == "training":
            ours = rescore(predictions, test, k=s.repeats)
            row.update(our_reward_accuracy=ours["accuracy"], our_reward_n=ours["questions"],
                       our_reward_format_rate=ours["format_rate"])  # fmt: skip
            if s.repeats > 1:
                row["our_reward_pass_at_k"] = ours["pass_at_k"]
            for key in ("short_questions", "unmatched"):  # short: fewer than k answers scored
                if ours[key]:
                    row[f"our_reward_{key}"] = ours[key]
        reward = f"our reward: {pct(row['our_reward_accuracy'])}%" if ours else ""
        samples = out / "samples" / f"{spec.label}-{mode}.md"
        header = (f"EvalScope {self.version}, {info['few_shot']}-shot, max_tokens {s.max_tokens} "
                  f"(from {s.max_tokens_from}), backend {backend}. Accuracy (EvalScope): "
                  f"{pct(row['accuracy'])}% of {row['n']}{'; ' * bool(ours)}{reward}.")  # fmt: skip
        write_atomic(samples, render_samples(
            spec.label, mode, header, read_jsonl(predictions), reviews,
            ours and ours["per_index"], test, s.samples))  # fmt: skip
        row.update(samples=os.path.relpath(samples, out),
                   seconds=round(time.perf_counter() - start, 1))  # fmt: skip
        print(f"{PROG}: {spec.label} / {mode}: accuracy {pct(row['accuracy'])}% (n={row['n']})"
              f"{', ' * bool(ours)}{reward.replace(':', '')}", flush=True)  # fmt: skip
        return row

    def summary(self, baseline: str, results: list[dict], seconds: float) -> dict[str, Any]:
        s = self.settings
        return {
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "evalscope_version": self.version,
            "benchmark_version": benchmark().evaluation_version,
            "baseline": baseline,
            "data": {
                "source": s.data,
                "dataset_dir": os.path.relpath(self.data_dir, s.out),
                "n_test": len(self.rows["test"]),
                "n_train": len(self.rows.get("train") or []),
            },  # fmt: skip
            "limit": s.limit,
            "generation": s.generation(),
            "modes": {m: mode_settings(m, s) for m in s.modes},
            "results": results,
            "seconds": round(seconds, 1),
        }


def write_comparison(out: Path, summary: dict, markdown: str) -> None:
    """comparison.json and comparison.md, then questions/questions.html, every model's answer
    question by question (none when every evaluation failed; a failure to write it: a warning)."""
    write_atomic(out / "comparison.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_atomic(out / "comparison.md", markdown)
    if all(r.get("error") is not None for r in summary["results"]):
        return
    page, issue = write_for_evaluation(out, summary.get("baseline"))
    if issue:
        print(f"{PROG}: warning: {issue}", file=sys.stderr)
    if page:
        print(f"{PROG}: which questions changed -> {page}")


def exit_interrupted(stop: BaseException, what: str) -> None:
    """Exit now (every server already stopped as the exception unwound), without waiting for
    EvalScope's worker threads to give up on their requests."""
    code = stop.code if isinstance(stop, SystemExit) and isinstance(stop.code, int) else 130
    print(f"{PROG}: interrupted; servers stopped, {what}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
