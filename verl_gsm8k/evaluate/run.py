"""Run EvalScope for one model in each mode, read back its outputs, and build the result rows.

A failed evaluation (EvalScope error, server that does not start, missing model) becomes a row
with ``error`` set; the other evaluations go on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.evaluate.render import pct, render_samples
from verl_gsm8k.evaluate.scoring import read_jsonl, read_report, rescore, review_scores
from verl_gsm8k.evaluate.server import ServerProcess, free_port, vllm_serve_command
from verl_gsm8k.evaluate.settings import (
    BENCHMARK,
    PROG,
    REPETITION_PENALTY,
    SUBSET,
    EvalError,
    ModelSpec,
    Settings,
    training_comparable_to,
)


def _metric_name(meta) -> str:
    names = [m if isinstance(m, str) else next(iter(m), "?") for m in meta.metric_list]
    return ", ".join(names) or "accuracy"


def batch_size(settings: Settings, api_url: str | None) -> int:
    """EvalScope's eval_batch_size: generation batch (local model) or concurrent requests."""
    return settings.batch_size or (64 if api_url else 8)


def mode_settings(mode: str, settings: Settings) -> dict:
    """What each mode means, for the task config and for the tables."""
    from evalscope.api.registry import BENCHMARK_REGISTRY

    from data_prep.gsm8k import PROMPT_STYLES

    meta = BENCHMARK_REGISTRY[BENCHMARK]
    if mode == "training":
        return {
            "dataset_args": {"few_shot_num": 0, "prompt_template": PROMPT_STYLES["hash"]},
            "few_shot": 0,
            "prompt_template": PROMPT_STYLES["hash"],
            "scorer": f"EvalScope {_metric_name(meta)} (Math-Verify) + our reward "
            "rewards/gsm8k.py:compute_score (number after the last ####)",
            "comparable_to": training_comparable_to(settings),
        }
    return {
        "dataset_args": {},
        "few_shot": meta.few_shot_num,
        "prompt_template": meta.prompt_template,
        "scorer": f"EvalScope {_metric_name(meta)} (Math-Verify)",
        "comparable_to": "Comparable to published EvalScope gsm8k numbers of the same release.",
    }


def run_evalscope(
    spec: ModelSpec,
    mode: str,
    settings: Settings,
    data_dir: Path,
    api_url: str | None,
    served_name: str | None,
    work_dir: Path,
) -> None:
    from evalscope import TaskConfig, run_task

    dataset_args = {"dataset_id": str(data_dir), **mode_settings(mode, settings)["dataset_args"]}
    # Greedy, and repetition_penalty 1.0 stated explicitly: otherwise the model's own
    # generation_config.json (Qwen2.5-Instruct: 1.1) is applied by transformers' generate and by
    # vLLM's server defaults, unlike verl's rollout/validation sampling.
    generation: dict[str, Any] = {
        "do_sample": False,
        "max_tokens": settings.max_tokens,
        "extra_body": {"repetition_penalty": REPETITION_PENALTY},
    }
    sampled: dict[str, Any] = {}
    if settings.repeats > 1:
        # k answers per question at a temperature: EvalScope repeats each question and reports
        # the mean over all answers (mean@k) and pass@n for n <= k; the mean stays the headline
        from evalscope.api.metric.semantics import MetricSelector

        # top_p/top_k as verl's rollout (1.0 / -1: off) unless asked: left out, the server and
        # transformers take them from the model's generation_config.json (Qwen2.5-Instruct: 0.8
        # and 20), a narrower distribution than the mean@N of training; transformers' "off" is 0
        top_k = settings.top_k if settings.top_k > 0 or api_url else 0
        generation.update(
            do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=top_k
        )
        dataset_args.update(
            aggregation="mean_and_pass_at_k",
            primary_metric=MetricSelector(name="accuracy", aggregation="mean"),
        )
        sampled = {"repeats": settings.repeats}
    kwargs: dict[str, Any] = {}
    if api_url:
        generation.setdefault("temperature", 0.0)
        kwargs = {
            "model": served_name,
            "eval_type": "openai_api",
            "api_url": api_url,
            "api_key": settings.api_key,
        }
    else:
        kwargs = {
            "model": spec.path,
            "eval_type": "llm_ckpt",
            "model_args": {"precision": settings.dtype},
        }
    config = TaskConfig(
        model_id=spec.label,
        datasets=[BENCHMARK],
        dataset_args={BENCHMARK: dataset_args},
        generation_config=generation,
        eval_batch_size=batch_size(settings, api_url),
        limit=settings.limit,
        work_dir=str(work_dir),
        no_timestamp=True,
        **sampled,
        **kwargs,
    )
    run_task(config)


def evalscope_log(out: Path, label: str, mode: str) -> Path:
    """Where everything EvalScope prints while evaluating ``label`` in ``mode`` goes."""
    return out / "logs" / f"evalscope-{label}-{mode}.log"


@contextlib.contextmanager
def console_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2: EvalScope's logger,
    progress bars, warnings of the libraries under it) to ``log``; an exception's traceback is
    written there too, and the exception goes on to the caller."""
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
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def last_line(err: Exception) -> str:
    """One line for a failed evaluation: ours as is, anything else as its type and last line."""
    if isinstance(err, EvalError):
        return str(err)
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__


def row_identity(spec: ModelSpec, backend: str, mode: str) -> dict[str, Any]:
    """The columns every comparison row starts with, evaluated or failed."""
    return {
        "model": spec.label,
        "model_source": spec.source,
        "model_path": spec.path,
        "backend": backend,
        "mode": mode,
        "accuracy": None,
        "n": 0,
    }


def evaluate_one(
    spec: ModelSpec,
    mode: str,
    settings: Settings,
    data_dir: Path,
    rows: dict[str, list[dict]],
    backend: str,
    api_url: str | None,
    served_name: str | None,
    compute_score,
    ground_truth,
    version: str,
) -> dict:
    """One model in one mode: EvalScope run into a fresh work directory, its outputs read back
    and checked, the training mode re-scored with our reward, the samples page written; the
    comparison row. An EvalError (or EvalScope's own) goes to the caller."""
    out = settings.out
    work_dir = out / "evalscope" / spec.label / mode
    if work_dir.exists():
        shutil.rmtree(work_dir)
    info = mode_settings(mode, settings)
    result = _new_row(spec, mode, settings, backend, api_url, version, info, work_dir)
    start = time.perf_counter()
    log = evalscope_log(out, spec.label, mode)
    print(f"{PROG}: evaluating {spec.label} in {mode} mode ({backend}); log: {log}", flush=True)
    with console_to(log):
        run_evalscope(spec, mode, settings, data_dir, api_url, served_name, work_dir)
    report, predictions, reviews = _read_outputs(work_dir, spec.label, settings, rows, data_dir)
    scored = [r["score"] for r in reviews.values() if r["score"] is not None]
    result.update(
        accuracy=report["score"],
        n=report["n"],
        correct=int(round(sum(scored))) if scored and settings.repeats == 1 else None,
        errored=report["errored"],
        report=os.path.relpath(report["path"], out),
        predictions=os.path.relpath(predictions, out),
    )
    if settings.repeats > 1:  # accuracy is mean@k; pass@k: a question with any right answer
        result["pass_at_k"] = report["pass_at_k"].get(settings.repeats)
    ours = None
    if mode == "training":
        ours = _add_our_reward(result, predictions, rows, compute_score, ground_truth, settings)
    samples = out / "samples" / f"{spec.label}-{mode}.md"
    header = _samples_header(version, info, settings, backend, result)
    write_atomic(
        samples,
        render_samples(
            spec.label,
            mode,
            read_jsonl(predictions),
            reviews,
            ours,
            rows["test"],
            ground_truth,
            settings.samples,
            header,
        ),
    )
    result["samples"] = os.path.relpath(samples, out)
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(
        f"{PROG}: {spec.label} / {mode}: accuracy {pct(result['accuracy'])}% (n={result['n']})"
        + (
            f", our reward {pct(result['our_reward_accuracy'])}%"
            if result["our_reward_accuracy"] is not None
            else ""
        ),
        flush=True,
    )
    return result


def _new_row(
    spec: ModelSpec,
    mode: str,
    settings: Settings,
    backend: str,
    api_url: str | None,
    version: str,
    info: dict,
    work_dir: Path,
) -> dict[str, Any]:
    """The comparison row before EvalScope runs: who, how (prompt, generation), where."""
    return {
        **row_identity(spec, backend, mode),
        "correct": None,
        "errored": None,
        "our_reward_accuracy": None,
        "our_reward_format_rate": None,
        "few_shot": info["few_shot"],
        "prompt_template": info["prompt_template"],
        "evalscope_version": version,
        "generation": {
            "max_tokens": settings.max_tokens,
            "max_tokens_from": settings.max_tokens_from,
            "temperature": settings.temperature if settings.repeats > 1 else 0.0,
            "do_sample": settings.repeats > 1,
            "samples_per_question": settings.repeats,
            **({"top_p": settings.top_p, "top_k": settings.top_k} if settings.repeats > 1 else {}),
            "repetition_penalty": REPETITION_PENALTY,
            "batch_size": batch_size(settings, api_url),
            **({"dtype": settings.dtype} if backend == "transformers" else {}),
        },
        "work_dir": os.path.relpath(work_dir, settings.out),
        "error": None,
    }


def _read_outputs(
    work_dir: Path, label: str, settings: Settings, rows: dict[str, list[dict]], data_dir: Path
) -> tuple[dict[str, Any], Path, dict]:
    """EvalScope's report, predictions file and reviews (empty without a reviews file); an
    EvalError when it wrote no predictions or scored another number of questions than asked."""
    report = read_report(work_dir, label)
    predictions = work_dir / "predictions" / label / f"{BENCHMARK}_{SUBSET}.jsonl"
    reviews_path = work_dir / "reviews" / label / f"{BENCHMARK}_{SUBSET}.jsonl"
    if not predictions.is_file():
        raise EvalError(f"EvalScope wrote no predictions at {predictions}")
    expected = min(settings.limit or len(rows["test"]), len(rows["test"]))
    if report["n"] != expected:
        raise EvalError(
            f"EvalScope scored {report['n']} questions but {data_dir} has {expected} to score "
            "(a stale datasets cache of another directory with the same name?)"
        )
    reviews = review_scores(reviews_path) if reviews_path.is_file() else {}
    return report, predictions, reviews


def _add_our_reward(
    result: dict[str, Any],
    predictions: Path,
    rows: dict[str, list[dict]],
    compute_score,
    ground_truth,
    settings: Settings,
):
    """The training mode's answers re-scored with our reward, into ``result``; the per-question
    scores, for the samples page."""
    rescored = rescore(predictions, rows["test"], compute_score, ground_truth, k=settings.repeats)
    result.update(
        our_reward_accuracy=rescored["accuracy"],
        our_reward_format_rate=rescored["format_rate"],
        our_reward_n=rescored["questions"],
    )
    if settings.repeats > 1:
        result["our_reward_pass_at_k"] = rescored["pass_at_k"]
        if rescored["short_questions"]:  # fewer than k answers scored: not in pass@k
            result["our_reward_short_questions"] = rescored["short_questions"]
    if rescored["unmatched"]:
        result["our_reward_unmatched"] = rescored["unmatched"]
    return rescored["per_index"]


def _samples_header(
    version: str, info: dict, settings: Settings, backend: str, result: dict[str, Any]
) -> str:
    """The samples page's first line: EvalScope's release, the prompt, the answer length, the
    backend, and the accuracy (ours beside EvalScope's, when scored)."""
    return (
        f"EvalScope {version}, {info['few_shot']}-shot, max_tokens {settings.max_tokens} "
        f"(from {settings.max_tokens_from}), "
        f"backend {backend}. Accuracy (EvalScope): {pct(result['accuracy'])}% of {result['n']}"
        + (
            f"; our reward: {pct(result['our_reward_accuracy'])}%"
            if result["our_reward_accuracy"] is not None
            else ""
        )
        + "."
    )


def evaluate_model(
    spec: ModelSpec,
    settings: Settings,
    data_dir: Path,
    rows: dict[str, list[dict]],
    compute_score,
    ground_truth,
    version: str,
) -> list[dict]:
    """All modes of one model; a failure is recorded in the rows, not raised."""
    backend = "api" if spec.api_url else settings.backend

    def failed(message: str, modes: list[str]) -> list[dict]:
        print(f"{PROG}: {spec.label} / {','.join(modes)} failed: {message}", file=sys.stderr)
        return [
            {
                **row_identity(spec, backend, mode),
                "evalscope_version": version,
                "error": message,
            }
            for mode in modes
        ]

    results: list[dict] = []

    def run_modes(api_url: str | None, served_name: str | None) -> None:
        for mode in settings.modes:
            try:
                results.append(
                    evaluate_one(
                        spec,
                        mode,
                        settings,
                        data_dir,
                        rows,
                        backend,
                        api_url,
                        served_name,
                        compute_score,
                        ground_truth,
                        version,
                    )
                )
            except Exception as err:  # one failed evaluation must not lose the others
                log = evalscope_log(settings.out, spec.label, mode)
                results.extend(failed(f"{last_line(err)} (full log: {log})", [mode]))

    try:
        if spec.api_url:
            run_modes(spec.api_url, spec.source)
        else:
            assert spec.path is not None, "resolve local models first (check_models)"
            if backend == "vllm":
                port = settings.port or free_port()
                cmd = vllm_serve_command(settings.vllm_bin, spec.path, port, spec.label,
                                         settings.vllm_args)  # fmt: skip
                log = settings.out / "logs" / f"vllm-{spec.label}.log"
                base = f"http://127.0.0.1:{port}/v1"
                with ServerProcess(
                    cmd, base, spec.label, log, settings.server_timeout, settings.api_key
                ):
                    run_modes(base, spec.label)
            else:
                run_modes(None, None)
    except EvalError as err:
        return failed(str(err), settings.modes)
    return results
