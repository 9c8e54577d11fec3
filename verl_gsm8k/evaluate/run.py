"""One evaluation session: every model in every mode, into comparison.md/.json; a failed
evaluation is a row with ``error``, the others go on."""

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
from verl_gsm8k.evaluate import settings as cfg
from verl_gsm8k.evaluate import tool_mode
from verl_gsm8k.evaluate.data import write_data
from verl_gsm8k.evaluate.render import pct, render_markdown, render_samples, render_steps
from verl_gsm8k.evaluate.scoring import add_deltas, read_jsonl, read_report, rescore, review_scores
from verl_gsm8k.evaluate.server import served
from verl_gsm8k.evaluate.settings import EvalError, ModelSpec, Settings
from verl_gsm8k.questions.runs import write_for_evaluation


@functools.cache
def benchmark() -> Any:
    """EvalScope's gsm8k benchmark, imported on first use."""
    from evalscope.api.registry import BENCHMARK_REGISTRY

    return BENCHMARK_REGISTRY[cfg.BENCHMARK]


def mode_settings(mode: str, settings: Settings) -> dict[str, Any]:
    from data_prep.gsm8k import PROMPT_STYLES

    if mode == tool_mode.MODE:
        from data_prep.gsm8k import TOOL_PROMPTS

        return {"few_shot": 0, "prompt_template": f"{TOOL_PROMPTS[mode]} | {{question}}",
                "scorer": "our reward rewards/gsm8k.py:compute_score on the last answer (after "
                "the calculator's replies), no EvalScope", "comparable_to": "The training mode "
                "of the same model on the same questions, without the tool."}  # fmt: skip
    meta, scorer = benchmark(), "EvalScope accuracy (Math-Verify)"
    if mode == "training":
        ours = " + our reward rewards/gsm8k.py:compute_score (number after the last ####)"
        return {"few_shot": 0, "prompt_template": PROMPT_STYLES["hash"], "scorer": scorer + ours,
                "comparable_to": settings.comparable_to()}  # fmt: skip
    return {"few_shot": meta.few_shot_num, "prompt_template": meta.prompt_template,
            "scorer": scorer, "comparable_to": "Comparable to published EvalScope gsm8k numbers "
            "of the same release."}  # fmt: skip


def run_evalscope(spec: ModelSpec, mode: str, s: Settings, data_dir: Path, url: str | None,
                  work_dir: Path) -> None:  # fmt: skip
    from evalscope import TaskConfig, run_task

    dataset: dict[str, Any] = {"dataset_id": str(data_dir)}
    if mode == "training":
        dataset.update(few_shot_num=0, prompt_template=mode_settings(mode, s)["prompt_template"])
    generation: dict[str, Any] = {"do_sample": False, "max_tokens": s.max_tokens}
    generation["extra_body"] = {"repetition_penalty": cfg.REPETITION_PENALTY}
    if s.repeats > 1:  # mean@k the headline, pass@n beside it
        from evalscope.api.metric.semantics import MetricSelector

        # transformers' "off" is 0
        top_k = s.top_k if s.top_k > 0 or url else 0
        generation.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=top_k)
        mean = MetricSelector(name="accuracy", aggregation="mean")
        dataset.update(aggregation="mean_and_pass_at_k", primary_metric=mean)
    if url:
        generation.setdefault("temperature", 0.0)
        name = spec.source if spec.api_url else spec.label  # vLLM serves it by its label
        model = {"model": name, "eval_type": "openai_api", "api_url": url, "api_key": s.api_key}
    else:
        model = {"model": spec.path, "eval_type": "llm_ckpt", "model_args": {"precision": s.dtype}}
    run_task(TaskConfig(
        model_id=spec.label, datasets=[cfg.BENCHMARK], dataset_args={cfg.BENCHMARK: dataset},
        generation_config=generation, eval_batch_size=s.batch_size or (64 if url else 8),
        limit=s.limit, work_dir=str(work_dir), no_timestamp=True, repeats=s.repeats, **model,
    ))  # fmt: skip


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


@contextlib.contextmanager
def console_to(log: Path) -> Iterator[None]:
    """File descriptors 1 and 2 and a traceback to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    _flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("ab") as handle:
        for fd in (1, 2):
            os.dup2(handle.fileno(), fd)
        try:
            yield
        except Exception:
            traceback.print_exc()
            raise
        finally:
            _flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


@dataclass
class Session:
    settings: Settings
    rows: dict[str, list[dict]]
    data_dir: Path
    version: str

    @classmethod
    def open(cls, s: Settings, rows: dict[str, list[dict]]) -> "Session":
        return cls(s, rows, write_data(rows, s.out / "data"), metadata.version("evalscope"))

    def row(self, spec: ModelSpec, backend: str, mode: str, error: str | None = None) -> dict:
        """A comparison row's identity; a failed one says why on stderr too."""
        if error is not None:
            print(f"{cfg.PROG}: {spec.label} / {mode} failed: {error}", file=sys.stderr)
        return {"model": spec.label, "model_source": spec.source, "model_path": spec.path,
                "backend": backend, "mode": mode, "accuracy": None, "n": 0,
                "evalscope_version": self.version, "error": error}  # fmt: skip

    def evaluate(self, spec: ModelSpec) -> list[dict]:
        s, rows = self.settings, []
        backend = "api" if spec.api_url else s.backend
        try:
            with contextlib.ExitStack() as stack:
                url = stack.enter_context(served(spec, s)) if backend == "vllm" else spec.api_url
                for mode in s.modes:
                    log = s.out / "logs" / f"evalscope-{spec.label}-{mode}.log"
                    try:
                        rows.append(self.evaluate_one(spec, mode, backend, url, log))
                    except Exception as err:  # one failed evaluation must not lose the others
                        last = [x.strip() for x in str(err).splitlines() if x.strip()][-1:]
                        why = ": ".join([type(err).__name__, *last])
                        why = str(err) if isinstance(err, EvalError) else why
                        rows.append(self.row(spec, backend, mode, f"{why} (full log: {log})"))
        except EvalError as err:  # the server did not start
            return [self.row(spec, backend, mode, str(err)) for mode in s.modes]
        return rows

    def evaluate_one(self, spec: ModelSpec, mode: str, backend: str, url: str | None,
                     log: Path) -> dict:  # fmt: skip
        s, test, start = self.settings, self.rows["test"], time.perf_counter()
        if mode == tool_mode.MODE:
            name = spec.source if spec.api_url else spec.label
            got = tool_mode.evaluate(url, name, test[: s.limit or len(test)], s)
            chats = s.out / "samples" / f"{spec.label}-{mode}.jsonl"
            write_atomic(chats, "".join(json.dumps(c) + "\n" for c in got.pop("chats")))
            row = {**self.row(spec, backend, mode), **got, "our_reward_accuracy": got["accuracy"],
                   "samples": os.path.relpath(chats, s.out)}  # fmt: skip
            return self.done(row, start, f", the tool called in {pct(row['tool_call_rate'])}%")
        work = s.out / "evalscope" / spec.label / mode
        shutil.rmtree(work, ignore_errors=True)
        print(f"{cfg.PROG}: evaluating {spec.label} in {mode} mode ({backend}); log: {log}",
              flush=True)  # fmt: skip
        with console_to(log):
            run_evalscope(spec, mode, s, self.data_dir, url, work)
        report = read_report(work, spec.label)
        name = f"{spec.label}/{cfg.BENCHMARK}_{cfg.SUBSET}.jsonl"  # EvalScope's file names
        predictions = work / "predictions" / name
        if not predictions.is_file():
            raise EvalError(f"EvalScope wrote no predictions at {predictions}")
        asked = min(s.limit or len(test), len(test))
        if report["n"] != asked:
            raise EvalError(f"EvalScope scored {report['n']} questions but {self.data_dir} has "
                            f"{asked} to score (a stale datasets cache of another directory with "
                            "the same name?)")  # fmt: skip
        reviews = review_scores(work / "reviews" / name)
        scored = [r["score"] for r in reviews.values() if r["score"] is not None]
        info, rel = mode_settings(mode, s), lambda path: os.path.relpath(path, s.out)
        samples = s.out / "samples" / f"{spec.label}-{mode}.md"
        row = {**self.row(spec, backend, mode), "accuracy": report["score"], "n": report["n"],
               "correct": round(sum(scored)) if scored and s.repeats == 1 else None,
               "errored": report["errored"], "our_reward_accuracy": None,
               "our_reward_format_rate": None, "few_shot": info["few_shot"],
               "prompt_template": info["prompt_template"], "generation": {
                   **s.generation(), "batch_size": s.batch_size or (64 if url else 8),
                   **({"dtype": s.dtype} if backend == "transformers" else {})},
               "work_dir": rel(work), "report": rel(report["path"]),
               "predictions": rel(predictions), "samples": rel(samples)}  # fmt: skip
        if s.repeats > 1:
            row["pass_at_k"] = report["pass_at_k"].get(s.repeats)
        ours = None
        if mode == "training":
            fields, ours = rescore(predictions, test, k=s.repeats)
            row.update(fields)
        ours_pct = None if ours is None else pct(row["our_reward_accuracy"])
        header = (f"EvalScope {self.version}, {info['few_shot']}-shot, max_tokens {s.max_tokens} "
                  f"(from {s.max_tokens_from}), backend {backend}. Accuracy (EvalScope): "
                  f"{pct(row['accuracy'])}% of {row['n']}"
                  + (f"; our reward: {ours_pct}%." if ours_pct else "."))  # fmt: skip
        write_atomic(samples, render_samples(spec.label, mode, header, read_jsonl(predictions),
                     reviews, ours, test, s.samples))  # fmt: skip
        return self.done(row, start, f", our reward {ours_pct}%" if ours_pct else "")

    @staticmethod
    def done(row: dict, start: float, more: str) -> dict:
        """The row timed, and its line said."""
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{cfg.PROG}: {row['model']} / {row['mode']}: accuracy {pct(row['accuracy'])}% "
              f"(n={row['n']}){more}", flush=True)  # fmt: skip
        return row

    def write(self, baseline: str, results: list[dict], seconds: float,
              sweep: dict | None = None) -> str:  # fmt: skip
        """comparison.json and .md, then questions/questions.html; returns the Markdown."""
        s, rows, out = self.settings, self.rows, self.settings.out
        add_deltas(results, baseline)
        data = {"source": s.data, "dataset_dir": os.path.relpath(self.data_dir, out),
                "n_test": len(rows["test"]), "n_train": len(rows.get("train") or [])}  # fmt: skip
        summary = {"created_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                   "evalscope_version": self.version,
                   "benchmark_version": benchmark().evaluation_version, "baseline": baseline,
                   "data": data, "limit": s.limit, "generation": s.generation(),
                   "modes": {m: mode_settings(m, s) for m in s.modes}, "results": results,
                   "seconds": round(seconds, 1), **({"sweep": sweep} if sweep else {})}  # fmt: skip
        markdown = (render_steps(summary) if sweep else "") + render_markdown(summary)
        write_atomic(out / "comparison.json", json.dumps(summary, indent=2, default=str) + "\n")
        write_atomic(out / "comparison.md", markdown)
        if any(r.get("error") is None for r in results):
            page, issue = write_for_evaluation(out, baseline)
            if issue:
                print(f"{cfg.PROG}: warning: {issue}", file=sys.stderr)
            if page:
                print(f"{cfg.PROG}: which questions changed -> {page}")
        return markdown


def exit_interrupted(stop: BaseException, what: str) -> None:
    """Exit now (the servers stopped as the exception unwound), not after EvalScope's threads."""
    code = stop.code if isinstance(stop, SystemExit) and isinstance(stop.code, int) else 130
    print(f"{cfg.PROG}: interrupted; servers stopped, {what}", file=sys.stderr)
    _flush()
    os._exit(code)
