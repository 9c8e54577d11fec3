#!/usr/bin/env python3
"""Evaluate models on the GSM8K test split with EvalScope, in two prompt modes, and compare them.

Run it through ``bash scripts/eval.sh`` (it uses the EvalScope environment, .venv-eval, which
must stay apart from verl's: EvalScope >= 1.13 needs antlr4 4.13, verl's Hydra 4.9).

Modes (``--modes``, both by default):

* ``training``: zero-shot, the prompt is exactly the training prompt
  (``data_prep.gsm8k.PROMPT_STYLES["hash"]``), so the score is comparable to verl's validation
  score. The saved predictions are also re-scored with our training reward
  (``rewards/gsm8k.py:compute_score``), and both accuracies are reported.
* ``evalscope``: EvalScope's own gsm8k setting (4-shot, ``\\boxed{}`` instruction, Math-Verify),
  comparable to published EvalScope numbers of the same EvalScope release.

Backends (``--backend``): ``vllm`` serves each model with ``vllm serve`` from the training
environment and evaluates it over the OpenAI API; ``transformers`` lets EvalScope load the model
itself; ``auto`` picks vllm when ``nvidia-smi`` sees a GPU. ``--api-url/--api-model`` evaluate an
already-running OpenAI-compatible server instead.

The data never comes from a hub at evaluation time: ``--data`` (a hub id, a directory with
train.jsonl/test.jsonl, the hub parquet layout, or verl's prepared train.parquet/test.parquet) is
read once and written in the hub layout into the output directory, and EvalScope reads that.

Outputs under ``--out``: ``comparison.md`` and ``comparison.json`` (written atomically),
``samples/<model>-<mode>.md``, EvalScope's work directories under ``evalscope/<model>/<mode>/``,
the prepared data under ``data/`` and server logs under ``logs/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomic_io import write_atomic

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROG = "eval.sh"
MODES = ("training", "evalscope")
BENCHMARK = "gsm8k"
SUBSET = "main"
DATA_SOURCE = "openai/gsm8k"
REWARD_FILE = ROOT / "rewards" / "gsm8k.py"
DEFAULT_SAMPLES = 10
LOG_TAIL_LINES = 40
REPETITION_PENALTY = 1.0


class EvalError(Exception):
    """A user-facing failure of one evaluation (bad model, server did not start, ...)."""


class UsageError(Exception):
    """Bad arguments or inputs: one line, exit 2, nothing evaluated."""


@dataclass
class ModelSpec:
    label: str  # model_id in EvalScope's outputs and in the tables
    source: str  # what the user gave: a directory, a hub id, or an API model name
    api_url: str | None = None  # set: an already-running OpenAI-compatible server
    path: str | None = None  # resolved local directory (local models)


@dataclass
class Settings:
    modes: list[str]
    backend: str
    max_tokens: int
    batch_size: int | None  # None: 8 for the transformers backend, 64 for a server
    limit: int | None
    dtype: str
    api_key: str
    vllm_bin: str
    vllm_args: list[str]
    server_timeout: float
    port: int | None
    samples: int
    out: Path


# ---------------------------------------------------------------------------------------------
# Small helpers (pure; tested without EvalScope)


def sanitize_label(text: str) -> str:
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return label or "model"


def parse_model_specs(values: list[str]) -> list[ModelSpec]:
    """``--model`` values, ``PATH_OR_HUB_ID`` or ``NAME=PATH_OR_HUB_ID``, with unique labels."""
    specs: list[ModelSpec] = []
    seen: set[str] = set()
    for value in values:
        name, sep, source = value.partition("=")
        if sep and name and source and "/" not in name:
            label = sanitize_label(name)
        else:
            source = value
            label = sanitize_label(Path(source.rstrip("/")).name or source)
        base, n = label, 2
        while label in seen:
            label, n = f"{base}-{n}", n + 1
        seen.add(label)
        specs.append(ModelSpec(label=label, source=source))
    return specs


def pick_baseline(specs: list[ModelSpec], wanted: str | None) -> str:
    if not specs:
        raise UsageError("no model to evaluate: give --model and/or --api-url with --api-model")
    if wanted is None:
        return specs[0].label
    wanted_path = Path(wanted).expanduser()
    for spec in specs:
        if wanted in (spec.label, spec.source):
            return spec.label
        source = Path(spec.source).expanduser()
        if wanted_path.exists() and source.exists() and wanted_path.resolve() == source.resolve():
            return spec.label
    labels = ", ".join(s.label for s in specs)
    raise UsageError(f"--baseline {wanted!r} is none of the evaluated models ({labels})")


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
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


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


def rescore(predictions: Path, rows: list[dict], compute_score, ground_truth) -> dict:
    """Re-score EvalScope's saved predictions with our reward: accuracy, format rate, n."""
    scores: dict[int, dict] = {}
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
    n = len(scores)
    return {
        "n": n,
        "unmatched": unmatched,
        "accuracy": sum(s["acc"] for s in scores.values()) / n if n else None,
        "format_rate": sum(s["format"] for s in scores.values()) / n if n else None,
        "per_index": scores,
    }


def read_report(work_dir: Path, label: str) -> dict:
    """EvalScope's ``reports/<model_id>/gsm8k.json``: primary metric score (0..1) and n."""
    path = work_dir / "reports" / label / f"{BENCHMARK}.json"
    if not path.is_file():
        raise EvalError(f"EvalScope wrote no report at {path}")
    report = json.loads(path.read_text(encoding="utf-8"))
    metrics = report.get("metrics") or []
    if not metrics:
        raise EvalError(f"EvalScope's report {path} has no metrics")
    metric = metrics[0]
    execution = report.get("execution_summary") or {}
    identity = metric.get("identity") or {}
    return {
        "path": path,
        "metric": identity.get("name") or metric.get("name"),
        "score": float(metric["score"]),
        "n": int(metric.get("num") or report.get("num") or 0),
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


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def _pp(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.2f}"


def render_markdown(summary: dict) -> str:
    gen = summary["generation"]
    lines = [
        "# GSM8K evaluation",
        "",
        f"EvalScope {summary['evalscope_version']} (benchmark gsm8k "
        f"{summary.get('benchmark_version') or '?'}), data `{summary['data']['source']}` "
        f"(test split, {summary['data']['n_test']} rows"
        + (f", limit {summary['limit']}" if summary.get("limit") else "")
        + f"), baseline **{summary['baseline']}**. Generation: greedy (temperature 0, "
        f"do_sample false, repetition_penalty {gen['repetition_penalty']}), max_tokens "
        f"{gen['max_tokens']}, batch size {gen['batch_size'] or 'auto (8 local, 64 server)'}.",
        "",
        "| model | mode | accuracy % (EvalScope) | n | our reward acc % | Δ vs baseline (pp) "
        "| Δ our reward (pp) | backend |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in summary["results"]:
        model = r["model"] + (" (baseline)" if r["model"] == summary["baseline"] else "")
        if r.get("error"):
            lines.append(f"| {model} | {r['mode']} | failed | — | — | — | — | {r['backend']} |")
            continue
        lines.append(
            f"| {model} | {r['mode']} | {_pct(r['accuracy'])} | {r['n']} "
            f"| {_pct(r.get('our_reward_accuracy'))} | {_pp(r.get('delta_vs_baseline'))} "
            f"| {_pp(r.get('our_reward_delta_vs_baseline'))} | {r['backend']} |"
        )
    lines += ["", "## Modes", ""]
    for mode, info in summary["modes"].items():
        template = info["prompt_template"].replace("{{", "{").replace("}}", "}")
        template = template.replace("\n", "\\n")
        lines.append(
            f"- **{mode}**: {info['few_shot']}-shot, scorer: {info['scorer']}; prompt template "
            f"`{template}`. {info['comparable_to']}"
        )
    failed = [r for r in summary["results"] if r.get("error")]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            first = r["error"].strip().splitlines()[0] if r["error"].strip() else "error"
            lines.append(f"- {r['model']} / {r['mode']}: {first}")
    lines += [
        "",
        "Accuracies from different prompts, few-shot settings or EvalScope releases are not "
        "comparable; compare rows of the same mode only. Samples: `samples/`.",
        "",
    ]
    return "\n".join(lines)


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_samples(
    label: str,
    mode: str,
    records: list[dict],
    reviews: dict[int, dict],
    ours: dict[int, dict] | None,
    rows: list[dict],
    ground_truth,
    k: int,
    header: str,
) -> str:
    lines = [
        f"# {label}: {mode} mode, first {min(k, len(records))} of {len(records)}",
        "",
        header,
        "",
    ]
    for record in sorted(records, key=lambda r: r.get("index", 0))[:k]:
        index = record.get("index")
        row = match_row(record, rows)
        review = reviews.get(index, {})
        response = response_text(record)
        fence = _fence(response)
        es = review.get("score")
        verdicts = [f"EvalScope {'correct' if es else 'wrong'} ({es})"]
        if ours is not None and index in ours:
            verdicts.append(f"our reward acc {ours[index]['acc']:.0f}")
        lines += [
            f"## test #{index}: {', '.join(verdicts)}",
            "",
            f"**Question:** {row['question'] if row else user_prompt(record)}",
            "",
            f"**Ground truth:** {ground_truth(row['answer']) if row else review.get('target')}"
            f" | **EvalScope extracted:** `{review.get('extracted')}`",
            "",
            "<details><summary>prompt sent (last user message)</summary>",
            "",
            _fence(user_prompt(record)) + "text",
            user_prompt(record),
            _fence(user_prompt(record)),
            "",
            "</details>",
            "",
            "**Response:**",
            "",
            fence + "text",
            response,
            fence,
            "",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Data


def prepare_data(source: str, data_root: Path) -> tuple[Path, dict[str, list[dict]]]:
    """Read GSM8K from ``source`` and write the hub layout EvalScope reads offline.

    The directory is named ``gsm8k-<content hash>``: ``datasets`` caches a local dataset
    directory under its base name and config only (``~/.cache/huggingface/datasets/<name>/main/
    0.0.0/<fixed hash>``), so a directory named just ``gsm8k`` would silently be served the rows
    of whichever ``gsm8k`` directory was loaded first. A content-derived name makes that cache
    correct by construction.
    """
    import hashlib

    from data_prep.gsm8k import DataPrepError, load_source, write_hub_layout

    path = Path(source).expanduser()
    try:
        if path.is_dir() and _is_verl_parquet_dir(path):
            splits = _load_verl_parquet_dir(path)
        else:
            splits = load_source(source)
    except DataPrepError as err:
        raise UsageError(f"--data: {err}") from None
    if not splits.get("test"):
        raise UsageError(f"--data {source}: the test split is empty")
    canonical = json.dumps(
        {k: [[r["question"], r["answer"]] for r in v] for k, v in sorted(splits.items())},
        ensure_ascii=False,
    )
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
    return write_hub_layout(splits, data_root / f"gsm8k-{digest}"), splits


def _is_verl_parquet_dir(path: Path) -> bool:
    hub = (path / "main").is_dir() or any(path.glob("test-*-of-*.parquet"))
    return (path / "test.parquet").is_file() and not (path / "test.jsonl").exists() and not hub


def _load_verl_parquet_dir(path: Path) -> dict[str, list[dict]]:
    """verl's prepared ``<split>.parquet``: the original question/answer are in extra_info."""
    import pyarrow.parquet as pq

    out: dict[str, list[dict]] = {}
    for split in ("train", "test"):
        file = path / f"{split}.parquet"
        if not file.is_file():
            continue
        rows = []
        for i, rec in enumerate(pq.read_table(file).to_pylist(), start=1):
            info = rec.get("extra_info") or {}
            if not info.get("question") or not info.get("answer"):
                raise UsageError(
                    f"--data {file}: row {i} has no extra_info.question/answer (not a "
                    "data_prep.gsm8k output); pass the original jsonl or hub layout instead"
                )
            rows.append({"question": info["question"], "answer": info["answer"]})
        out[split] = rows
    return out


# ---------------------------------------------------------------------------------------------
# Models and servers


def has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.startswith("GPU") for line in out.splitlines())


def resolve_model_path(source: str) -> str:
    """A local directory for a model: the directory itself, or the hub snapshot (cached)."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EvalError(f"{path} has no config.json (not a Hugging Face model directory)")
        return str(path.resolve())
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise EvalError(f"model not found: {source} (neither a directory nor a hub id)")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(
            source, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
        )
    except Exception as err:  # offline, unknown repo, no access: all mean "not here"
        raise EvalError(
            f"cannot get {source} from the Hugging Face hub or its cache "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "download it once with network, or pass a local directory"
        ) from None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


class ServerProcess:
    """``vllm serve`` (or anything with its command line) in its own process group."""

    def __init__(
        self, cmd: list[str], base_url: str, served_name: str, log_path: Path, timeout: float
    ):
        self.cmd, self.base_url, self.served_name = cmd, base_url, served_name
        self.log_path, self.timeout = log_path, timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"{PROG}: starting server: {' '.join(self.cmd)}  (log: {self.log_path})", flush=True)
        with self.log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(
                    self.cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as err:
                raise EvalError(f"cannot start the server {self.cmd[0]}: {err}") from None
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout
        url = f"{self.base_url}/models"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise EvalError(
                    f"the server exited with code {code} before answering {url}; last lines of "
                    f"{self.log_path}:\n{log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    models = json.loads(response.read().decode("utf-8")).get("data") or []
                if any(m.get("id") == self.served_name for m in models):
                    print(f"{PROG}: server ready at {self.base_url}", flush=True)
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(1.0)
        raise EvalError(
            f"the server did not answer {url} within {self.timeout:.0f} s; last lines of "
            f"{self.log_path}:\n{log_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after 30 s."""
        proc = self.proc
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(timeout=wait)
                # the leader is gone; make sure no child of the group survives it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.wait(timeout=10)
        print(f"{PROG}: server stopped (pid {proc.pid})", flush=True)
        self.proc = None


# ---------------------------------------------------------------------------------------------
# EvalScope


def _metric_name(meta) -> str:
    names = [m if isinstance(m, str) else next(iter(m), "?") for m in meta.metric_list]
    return ", ".join(names) or "accuracy"


def batch_size(settings: Settings, api_url: str | None) -> int:
    """EvalScope's eval_batch_size: generation batch (local model) or concurrent requests."""
    return settings.batch_size or (64 if api_url else 8)


def mode_settings(mode: str) -> dict:
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
            "comparable_to": "Comparable to verl's validation score (val-core/openai/gsm8k/acc).",
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

    dataset_args = {"dataset_id": str(data_dir), **mode_settings(mode)["dataset_args"]}
    # Greedy, and repetition_penalty 1.0 stated explicitly: otherwise the model's own
    # generation_config.json (Qwen2.5-Instruct: 1.1) is applied by transformers' generate and by
    # vLLM's server defaults, unlike verl's rollout/validation sampling.
    generation: dict[str, Any] = {
        "do_sample": False,
        "max_tokens": settings.max_tokens,
        "extra_body": {"repetition_penalty": REPETITION_PENALTY},
    }
    kwargs: dict[str, Any] = {}
    if api_url:
        generation["temperature"] = 0.0
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
        **kwargs,
    )
    run_task(config)


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
    out = settings.out
    work_dir = out / "evalscope" / spec.label / mode
    if work_dir.exists():
        shutil.rmtree(work_dir)
    info = mode_settings(mode)
    result: dict[str, Any] = {
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
            "temperature": 0.0,
            "do_sample": False,
            "repetition_penalty": REPETITION_PENALTY,
            "batch_size": batch_size(settings, api_url),
            **({"dtype": settings.dtype} if backend == "transformers" else {}),
        },
        "work_dir": os.path.relpath(work_dir, out),
        "error": None,
    }
    start = time.perf_counter()
    print(f"{PROG}: evaluating {spec.label} in {mode} mode ({backend})", flush=True)
    run_evalscope(spec, mode, settings, data_dir, api_url, served_name, work_dir)
    report = read_report(work_dir, spec.label)
    predictions = work_dir / "predictions" / spec.label / f"{BENCHMARK}_{SUBSET}.jsonl"
    reviews_path = work_dir / "reviews" / spec.label / f"{BENCHMARK}_{SUBSET}.jsonl"
    if not predictions.is_file():
        raise EvalError(f"EvalScope wrote no predictions at {predictions}")
    expected = min(settings.limit or len(rows["test"]), len(rows["test"]))
    if report["n"] != expected:
        raise EvalError(
            f"EvalScope scored {report['n']} questions but {data_dir} has {expected} to score "
            "(a stale datasets cache of another directory with the same name?)"
        )
    reviews = review_scores(reviews_path) if reviews_path.is_file() else {}
    scored = [r["score"] for r in reviews.values() if r["score"] is not None]
    result.update(
        accuracy=report["score"],
        n=report["n"],
        correct=int(round(sum(scored))) if scored else None,
        errored=report["errored"],
        report=os.path.relpath(report["path"], out),
        predictions=os.path.relpath(predictions, out),
    )
    ours = None
    if mode == "training":
        rescored = rescore(predictions, rows["test"], compute_score, ground_truth)
        ours = rescored["per_index"]
        result.update(
            our_reward_accuracy=rescored["accuracy"],
            our_reward_format_rate=rescored["format_rate"],
            our_reward_n=rescored["n"],
        )
        if rescored["unmatched"]:
            result["our_reward_unmatched"] = rescored["unmatched"]
    samples = out / "samples" / f"{spec.label}-{mode}.md"
    header = (
        f"EvalScope {version}, {info['few_shot']}-shot, max_tokens {settings.max_tokens}, "
        f"backend {backend}. Accuracy (EvalScope): {_pct(result['accuracy'])}% of {result['n']}"
        + (
            f"; our reward: {_pct(result['our_reward_accuracy'])}%"
            if result["our_reward_accuracy"] is not None
            else ""
        )
        + "."
    )
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
        f"{PROG}: {spec.label} / {mode}: accuracy {_pct(result['accuracy'])}% (n={result['n']})"
        + (
            f", our reward {_pct(result['our_reward_accuracy'])}%"
            if result["our_reward_accuracy"] is not None
            else ""
        ),
        flush=True,
    )
    return result


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

    def failed(message: str) -> list[dict]:
        print(f"{PROG}: {spec.label} failed: {message}", file=sys.stderr, flush=True)
        return [
            {
                **row_identity(spec, backend, mode),
                "evalscope_version": version,
                "error": message,
            }
            for mode in settings.modes
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
                message = str(err) if isinstance(err, EvalError) else f"{type(err).__name__}: {err}"
                results.extend(r for r in failed(message) if r["mode"] == mode)

    try:
        if spec.api_url:
            run_modes(spec.api_url, spec.source)
        else:
            spec.path = resolve_model_path(spec.source)
            if backend == "vllm":
                port = settings.port or free_port()
                cmd = [
                    settings.vllm_bin,
                    "serve",
                    spec.path,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--served-model-name",
                    spec.label,
                    *settings.vllm_args,
                ]
                log = settings.out / "logs" / f"vllm-{spec.label}.log"
                base = f"http://127.0.0.1:{port}/v1"
                with ServerProcess(cmd, base, spec.label, log, settings.server_timeout):
                    run_modes(base, spec.label)
            else:
                run_modes(None, None)
    except EvalError as err:
        return failed(str(err))
    return results


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Evaluate models on GSM8K (test split) with EvalScope in two prompt modes "
        "and write comparison.md/.json. Example: bash scripts/eval.sh --model "
        "Qwen/Qwen2.5-0.5B-Instruct --model ppo=merged/step580 --data ~/data/gsm8k-original",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[NAME=]PATH_OR_HUB_ID",
        help="a model to evaluate (repeatable): a Hugging Face model directory (e.g. made by "
        "scripts/merge.sh) or a hub id; NAME= sets its label in the tables (default: the last "
        "path component). The first is the baseline unless --baseline says otherwise",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="label, path or hub id of the model the deltas are computed against (default: "
        "the first model)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated prompt modes: 'training' (0-shot, the training prompt, also "
        "re-scored with our reward) and/or 'evalscope' (EvalScope's default: 4-shot, boxed, "
        "Math-Verify); default: both",
    )
    parser.add_argument(
        "--backend",
        choices=["auto", "vllm", "transformers"],
        default="auto",
        help="how local models are run: vllm (served by 'vllm serve' from the training env, "
        "evaluated over the OpenAI API), transformers (EvalScope loads the model), auto (vllm "
        "when nvidia-smi sees a GPU; the default)",
    )
    parser.add_argument(
        "--api-url",
        default=None,
        help="evaluate an already-running OpenAI-compatible server at this base URL (e.g. "
        "http://127.0.0.1:8000/v1) instead of / besides local models; needs --api-model",
    )
    parser.add_argument(
        "--api-model", default=None, help="the served model name at --api-url (also its label)"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY") or "EMPTY",
        help="API key for --api-url / vLLM (default: $OPENAI_API_KEY or EMPTY)",
    )
    parser.add_argument(
        "--data",
        default=DATA_SOURCE,
        help="GSM8K source: a hub dataset id, or a directory with train.jsonl/test.jsonl, the "
        "hub parquet layout (main/test-00000-of-00001.parquet) or data_prep's "
        "train.parquet/test.parquet. It is copied in the hub layout under --out; EvalScope "
        f"never downloads it (default: {DATA_SOURCE})",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="evaluate only the first N test questions (EvalScope's limit; for quick runs)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=1024, help="maximum new tokens per answer (default 1024)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="EvalScope's eval_batch_size: generation batch (transformers) or concurrent "
        "requests (vllm/api); default 8 for transformers, 64 otherwise",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="transformers backend weights dtype: float32, bfloat16, float16 or auto "
        "(bfloat16 with a GPU, float32 on CPU)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: outputs/eval-<timestamp> under the repository)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="allow an --out directory that already holds a comparison (its files are replaced)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        help="how many responses per model and mode to write to samples/<model>-<mode>.md (default "
        f"{DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--vllm-bin",
        default=os.environ.get("VLLM_BIN") or str(ROOT / ".venv" / "bin" / "vllm"),
        help="the vllm executable (default: $VLLM_BIN or <repo>/.venv/bin/vllm: the training "
        "environment, not .venv-eval)",
    )
    parser.add_argument(
        "--vllm-args",
        default=os.environ.get("VLLM_ARGS", ""),
        help="extra arguments for 'vllm serve', one string, e.g. '--gpu-memory-utilization "
        "0.8 --max-model-len 4096'",
    )
    parser.add_argument(
        "--port", type=int, default=None, help="port for vllm serve (default: a free one)"
    )
    parser.add_argument(
        "--server-timeout",
        type=float,
        default=900,
        help="seconds to wait for the vLLM server to answer /v1/models (default 900)",
    )
    return parser


def parse_settings(args: argparse.Namespace) -> tuple[Settings, list[ModelSpec]]:
    import shlex

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"--modes: unknown mode {bad[0] if bad else '(none)'!r}; use {MODES}")
    if bool(args.api_url) != bool(args.api_model):
        raise UsageError("--api-url and --api-model go together")
    for name in ("limit", "max_tokens", "batch_size", "samples"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "samples" else 1):
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    specs = parse_model_specs(args.model)
    if args.api_url:
        label = sanitize_label(args.api_model)
        if label in {s.label for s in specs}:
            label = f"{label}-api"
        specs.append(
            ModelSpec(label=label, source=args.api_model, api_url=args.api_url.rstrip("/"))
        )
    backend = args.backend
    local = [s for s in specs if not s.api_url]
    gpu = has_gpu() if (backend == "auto" or args.dtype == "auto") and local else False
    if backend == "auto":
        backend = "vllm" if gpu else "transformers"
    if backend == "vllm" and local and not Path(args.vllm_bin).exists():
        raise UsageError(
            f"--backend vllm: {args.vllm_bin} not found (build the training env with "
            "'bash scripts/setup.sh' on the GPU machine, or set --vllm-bin / VLLM_BIN)"
        )
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if gpu else "float32")
    out = args.out or ROOT / "outputs" / f"eval-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out = out.expanduser().resolve()
    if (out / "comparison.json").exists() and not args.force:
        raise UsageError(f"{out} already holds a comparison (pass --force or another --out)")
    settings = Settings(
        modes=modes,
        backend=backend,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        limit=args.limit,
        dtype=dtype,
        api_key=args.api_key,
        vllm_bin=args.vllm_bin,
        vllm_args=shlex.split(args.vllm_args),
        server_timeout=args.server_timeout,
        port=args.port,
        samples=args.samples,
        out=out,
    )
    return settings, specs


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through every finally/with: servers are stopped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings, specs = parse_settings(args)
        baseline = pick_baseline(specs, args.baseline)
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the data is always local by now

    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        data_dir, rows = prepare_data(args.data, out / "data")
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    if "evalscope" in settings.modes and len(rows.get("train") or []) < 4:
        print(
            f"{PROG}: --data {args.data}: evalscope mode needs >= 4 train rows for its "
            "4-shot examples",
            file=sys.stderr,
        )
        return 2

    import evalscope

    from data_prep.gsm8k import ground_truth

    compute_score = load_reward()
    version = evalscope.__version__
    from evalscope.api.registry import BENCHMARK_REGISTRY

    results: list[dict] = []
    try:
        for spec in specs:
            results += evaluate_model(
                spec, settings, data_dir, rows, compute_score, ground_truth, version
            )
    except (KeyboardInterrupt, SystemExit) as stop:
        # Every server was stopped while the exception unwound its `with` block. Exit now,
        # without waiting for EvalScope's worker threads to give up on their requests.
        code = stop.code if isinstance(stop, SystemExit) and isinstance(stop.code, int) else 130
        print(f"{PROG}: interrupted; servers stopped, no comparison written", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    add_deltas(results, baseline)
    summary = {
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "evalscope_version": version,
        "benchmark_version": BENCHMARK_REGISTRY[BENCHMARK].evaluation_version,
        "baseline": baseline,
        "data": {
            "source": args.data,
            "dataset_dir": os.path.relpath(data_dir, out),
            "n_test": len(rows["test"]),
            "n_train": len(rows.get("train") or []),
        },
        "limit": settings.limit,
        "generation": {
            "max_tokens": settings.max_tokens,
            "temperature": 0.0,
            "do_sample": False,
            "repetition_penalty": REPETITION_PENALTY,
            "batch_size": settings.batch_size,
        },
        "modes": {
            m: {k: v for k, v in mode_settings(m).items() if k != "dataset_args"}
            for m in settings.modes
        },
        "results": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_atomic(out / "comparison.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_atomic(out / "comparison.md", render_markdown(summary))
    print(
        f"\n{render_markdown(summary)}\n{PROG}: wrote {out / 'comparison.md'} and comparison.json"
    )
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
