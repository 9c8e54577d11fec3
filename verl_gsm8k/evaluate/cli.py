"""``python -m verl_gsm8k.evaluate``, run by scripts/eval.sh in .venv-eval: models on the GSM8K
test split with EvalScope in two prompt modes, or every checkpoint of a run (``--run``), into
comparison.md/.json. Every argument, model, --api-url and the data are checked before anything is
written; docs/evaluate.md says the rest."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

from verl_gsm8k.common import gpus
from verl_gsm8k.common.run_dir import CHECKPOINT_EVAL_DIR, STEP_N
from verl_gsm8k.evaluate.data import load_data
from verl_gsm8k.evaluate.render import render_markdown
from verl_gsm8k.evaluate.run import Session, exit_interrupted, write_comparison
from verl_gsm8k.evaluate.scoring import add_deltas
from verl_gsm8k.evaluate.server import probe_openai, resolve_model_path
from verl_gsm8k.evaluate.settings import (
    DATA_SOURCE,
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_DEFAULT,
    MAX_TOKENS_FLAG,
    MODES,
    PROG,
    ROOT,
    EvalError,
    ModelSpec,
    Settings,
    UsageError,
)
from verl_gsm8k.evaluate.sweep import BASELINE, Run, earlier_rows, run_sweep

# Top-p and top-k go to the server as verl's rollout has them: left out, the server takes the
# model's generation_config.json (Qwen2.5-Instruct: 0.8 and 20).
SAMPLING = "with --samples-per-question > 1 (default {}: off, as verl's rollout; sent explicitly)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Evaluate models on GSM8K (test split) with EvalScope in two prompt modes "
        "and write comparison.md/.json. Example: bash scripts/eval.sh --model "
        "Qwen/Qwen2.5-0.5B-Instruct --model ppo=merged/best --data ~/data/gsm8k",
    )
    add = p.add_argument
    add("--model", action="append", default=[], metavar="[NAME=]PATH_OR_HUB_ID",
        help="a model (repeatable): a Hugging Face model directory (e.g. from scripts/merge.sh) "
        "or a hub id; NAME= labels it (default: the last path component). The first is the "
        "baseline")  # fmt: skip
    add("--baseline", help="label, path or hub id of the model the deltas are computed against")
    add("--modes", default=",".join(MODES),
        help="comma-separated: 'training' (0-shot, the training prompt, also re-scored with our "
        "reward) and/or 'evalscope' (EvalScope's 4-shot boxed default); default: both")  # fmt: skip
    add("--backend", choices=["auto", "vllm", "transformers"], default="auto",
        help="local models served by 'vllm serve' (training env) over the OpenAI API, or loaded "
        "by EvalScope with transformers; auto: vllm when nvidia-smi sees a GPU")  # fmt: skip
    add("--api-url", help="evaluate an already-running OpenAI-compatible server at this base URL "
        "(e.g. http://127.0.0.1:8000/v1), alone or beside --model; needs --api-model")  # fmt: skip
    add("--api-model", help="the served model name at --api-url (also its label)")
    add("--api-key", default=os.environ.get("OPENAI_API_KEY") or "EMPTY",
        help="API key for --api-url / vLLM (default: $OPENAI_API_KEY or EMPTY)")  # fmt: skip
    add("--run", type=Path, metavar="RUN_DIR",
        help=f"evaluate every kept {STEP_N} of a PPO/GRPO run (merged one at a time) and its "
        "starting model (step 0) the same way, on the run's validation data unless --data; "
        "writes accuracy by step to RUN_DIR/checkpoint_eval/ (or --out); a rerun evaluates "
        "only the steps it lacks")  # fmt: skip
    add("--data", help="GSM8K: a hub id, or a directory with train.jsonl/test.jsonl, the hub "
        "parquet layout or data_prep's train.parquet/test.parquet; copied in the hub layout "
        f"under --out, never downloaded by EvalScope (default: {DATA_SOURCE})")  # fmt: skip
    add("--limit", type=int, help="only the first N test questions (for quick runs)")
    add(MAX_TOKENS_FLAG, type=int,
        help="maximum new tokens per answer; default: with --run the run's own data."
        f"max_response_length (verl scored a cut answer 0), else {DEFAULT_MAX_TOKENS}")  # fmt: skip
    add("--batch-size", type=int,
        help="generation batch (transformers, default 8) or requests at once (64)")  # fmt: skip
    add("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="transformers backend weights (auto: bfloat16 on a GPU, else float32)")  # fmt: skip
    add("--out", type=Path, help="output directory (default: outputs/eval-<timestamp>)")
    add("--force", action="store_true", help="replace a comparison already in --out")
    add("--samples", type=int, default=10,
        help="responses per model and mode in samples/<model>-<mode>.md (default 10)")  # fmt: skip
    add("--samples-per-question", type=int, default=1, metavar="K",
        help="sample K answers per question at --temperature: accuracy is then mean@K, with "
        "pass@K beside it, by EvalScope and by our reward (default 1: greedy)")  # fmt: skip
    add("--temperature", type=float, default=1.0,
        help="temperature with --samples-per-question > 1 (default 1.0, verl's)")  # fmt: skip
    add("--top-p", type=float, default=1.0, help="nucleus sampling " + SAMPLING.format(1.0))
    add("--top-k", type=int, default=-1, help="top-k sampling " + SAMPLING.format(-1))
    add("--vllm-bin", default=os.environ.get("VLLM_BIN") or str(ROOT / ".venv/bin/vllm"),
        help="the vllm executable (default: $VLLM_BIN or .venv/bin/vllm)")  # fmt: skip
    add("--vllm-args", default=os.environ.get("VLLM_ARGS", ""),
        help="extra 'vllm serve' arguments, one string, e.g. '--max-model-len 4096'")  # fmt: skip
    add("--port", type=int, help="port for vllm serve (default: a free one)")
    add("--server-timeout", type=float, default=900,
        help="seconds to wait for the vLLM server to answer /v1/models (default 900)")  # fmt: skip
    return p


def sanitize_label(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"


def parse_model_specs(values: list[str]) -> list[ModelSpec]:
    """``--model`` values, ``PATH_OR_HUB_ID`` or ``NAME=PATH_OR_HUB_ID``, with unique labels."""
    specs: list[ModelSpec] = []
    for value in values:
        name, sep, source = value.partition("=")
        if not (sep and name and source and "/" not in name):
            name, source = Path(value.rstrip("/")).name or value, value
        label = base = sanitize_label(name)
        n = 2
        while label in {s.label for s in specs}:
            label, n = f"{base}-{n}", n + 1
        specs.append(ModelSpec(label=label, source=source))
    return specs


def pick_baseline(specs: list[ModelSpec], wanted: str | None) -> str:
    if not specs:
        raise UsageError("no model to evaluate: give --model and/or --api-url with --api-model")
    if wanted is None:
        return specs[0].label
    path = Path(wanted).expanduser()
    for spec in specs:
        source = Path(spec.source).expanduser()
        same = path.exists() and source.exists() and path.resolve() == source.resolve()
        if wanted in (spec.label, spec.source) or same:
            return spec.label
    labels = ", ".join(s.label for s in specs)
    raise UsageError(f"--baseline {wanted!r} is none of the evaluated models ({labels})")


def parse_settings(args: argparse.Namespace) -> tuple[Settings, list[ModelSpec], Run | None]:
    """Every argument checked (UsageError), once, for --model and --run alike."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES] or ([] if modes else ["(none)"])
    if bad:
        raise UsageError(f"--modes: unknown mode {bad[0]!r}; use {MODES}")
    if bool(args.api_url) != bool(args.api_model):
        raise UsageError("--api-url and --api-model go together")
    for name in ("limit", "max_tokens", "batch_size", "samples", "samples_per_question"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "samples" else 1):
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k == 0 or args.top_k < -1:
        raise UsageError(f"--top-k must be -1 (off) or positive, got {args.top_k}")
    if args.samples_per_question > 1 and not args.temperature > 0:
        raise UsageError(f"--temperature must be > 0 to sample answers, got {args.temperature}")
    if args.run and (args.model or args.api_url):
        raise UsageError("--run evaluates a run's checkpoints: not with --model/--api-url")
    run = Run.read(args.run) if args.run else None
    specs = parse_model_specs(args.model)
    if args.api_url:
        label = sanitize_label(args.api_model)
        label += "-api" if label in {s.label for s in specs} else ""
        specs.append(ModelSpec(label, args.api_model, api_url=args.api_url.rstrip("/")))
    local = run is not None or any(not s.api_url for s in specs)
    gpu = local and "auto" in (args.backend, args.dtype) and bool(gpus.listed())
    backend = args.backend if args.backend != "auto" else "vllm" if gpu else "transformers"
    if backend == "vllm" and local and not Path(args.vllm_bin).exists():
        raise UsageError(f"--backend vllm: {args.vllm_bin} not found (build the training env "
                         "with 'bash scripts/setup.sh', or set --vllm-bin / VLLM_BIN)")  # fmt: skip
    stamp = f"eval-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out = args.out or (run.dir / CHECKPOINT_EVAL_DIR if run else ROOT / "outputs" / stamp)
    out = out.expanduser().resolve()
    if not run and (out / "comparison.json").exists() and not args.force:
        raise UsageError(f"{out} already holds a comparison (pass --force or another --out)")
    tokens = (DEFAULT_MAX_TOKENS, MAX_TOKENS_DEFAULT)
    if args.max_tokens is not None or run:
        tokens = (args.max_tokens, MAX_TOKENS_FLAG) if args.max_tokens else run.max_tokens()
    sampled = args.samples_per_question > 1
    settings = Settings(
        modes=modes, backend=backend, out=out,
        data=args.data or (run.default_data() if run else DATA_SOURCE),
        max_tokens=tokens[0], max_tokens_from=tokens[1], limit=args.limit,
        batch_size=args.batch_size, samples=args.samples, api_key=args.api_key,
        dtype=args.dtype if args.dtype != "auto" else "bfloat16" if gpu else "float32",
        repeats=args.samples_per_question, temperature=args.temperature if sampled else 0.0,
        top_p=args.top_p, top_k=args.top_k, vllm_bin=args.vllm_bin,
        vllm_args=shlex.split(args.vllm_args), server_timeout=args.server_timeout,
        port=args.port,
    )  # fmt: skip
    return settings, specs, run


def check_models(specs: list[ModelSpec], api_key: str) -> None:
    """Every local model resolved (``spec.path``), every --api-url probed; else UsageError."""
    for spec in specs:
        if spec.api_url:
            problem = probe_openai(spec.api_url, spec.source, api_key)
            if problem:
                raise UsageError(f"--api-url {spec.api_url}: {problem}")
            continue
        try:
            spec.path = resolve_model_path(spec.source)
        except EvalError as err:
            raise UsageError(f"--model {spec.source}: {err}") from None


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through every finally/with: servers are stopped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the data is copied under --out
    try:  # nothing is written before every input is known good: a fixed rerun needs no --force
        settings, specs, run = parse_settings(args)
        baseline = BASELINE if run else pick_baseline(specs, args.baseline)
        earlier = earlier_rows(settings.out, settings.key()) if run else []
        rows = load_data(settings.data, settings.modes)
        check_models(specs, settings.api_key)
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    session = Session.open(settings, rows)
    if run:
        return run_sweep(run, session, earlier)
    started, results = time.perf_counter(), []
    try:
        for spec in specs:
            results += session.evaluate(spec)
    except (KeyboardInterrupt, SystemExit) as stop:
        exit_interrupted(stop, "no comparison written")
    add_deltas(results, baseline)
    summary = session.summary(baseline, results, time.perf_counter() - started)
    markdown = render_markdown(summary)
    write_comparison(settings.out, summary, markdown)
    print(f"\n{markdown}\n{PROG}: wrote {settings.out / 'comparison.md'} and comparison.json")
    return 1 if any(r.get("error") for r in results) else 0
