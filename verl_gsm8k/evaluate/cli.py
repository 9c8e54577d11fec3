"""``python -m verl_gsm8k.evaluate`` (scripts/eval.sh, in .venv-eval): docs/evaluate.md."""

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
from verl_gsm8k.evaluate import settings as cfg
from verl_gsm8k.evaluate.data import load_data
from verl_gsm8k.evaluate.run import Session, exit_interrupted
from verl_gsm8k.evaluate.server import probe_openai, resolve_model_path
from verl_gsm8k.evaluate.settings import EvalError, ModelSpec, Settings, UsageError
from verl_gsm8k.evaluate.sweep import BASELINE, Run, earlier_rows, run_sweep


def build_parser() -> argparse.ArgumentParser:
    about = "Models on GSM8K's test split with EvalScope, into comparison.md (docs/evaluate.md)"
    p = argparse.ArgumentParser(prog=cfg.PROG, description=about)
    add = p.add_argument
    add("--model", action="append", default=[], metavar="[NAME=]PATH_OR_HUB_ID",
        help="a model directory or hub id (repeatable; the first is the baseline)")  # fmt: skip
    add("--baseline", help="label, path or hub id of the model the deltas are against")
    add("--modes", default=",".join(cfg.DEFAULT_MODES), help="training, evalscope and/or "
        "calculator (the training prompt with the calculator tool, through a vLLM server; "
        "default: training,evalscope)")  # fmt: skip
    add("--backend", choices=["auto", "vllm", "transformers"], default="auto",
        help="'vllm serve' (.venv) or EvalScope's transformers (auto: vllm on a GPU)")  # fmt: skip
    add("--api-url", help="an OpenAI-compatible server already running (with --api-model)")
    add("--api-model", help="the model served at --api-url (also its label)")
    add("--api-key", default=os.environ.get("OPENAI_API_KEY") or "EMPTY", help="($OPENAI_API_KEY)")
    add("--run", type=Path, metavar="RUN_DIR",
        help=f"every kept {STEP_N} of a run and step 0, into RUN_DIR/checkpoint_eval/")  # fmt: skip
    add("--data", help=f"a hub id or GSM8K directory (default {cfg.DATA_SOURCE}; --run: its own)")
    add("--limit", type=int, help="only the first N test questions (quick runs)")
    add(cfg.MAX_TOKENS_FLAG, type=int,
        help=f"per answer (--run: its response length, else {cfg.DEFAULT_MAX_TOKENS})")  # fmt: skip
    add("--batch-size", type=int, help="batch (transformers: 8) or requests at once (64)")
    add("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="transformers' weights (auto: bfloat16 on a GPU, else float32)")  # fmt: skip
    add("--out", type=Path, help="output directory (default: outputs/eval-<timestamp>)")
    add("--force", action="store_true", help="replace a comparison already in --out")
    add("--samples", type=int, default=10, help="answers shown per model and mode (10)")
    add("--samples-per-question", type=int, default=1, metavar="K",
        help="K sampled answers a question: mean@K, and pass@K beside it (1: greedy)")  # fmt: skip
    # sent explicitly: else a server takes the model's generation_config.json
    add("--temperature", type=float, default=1.0, help="with K > 1 (default 1.0, verl's)")
    add("--top-p", type=float, default=1.0, help="with K > 1 (default 1.0: off, verl's)")
    add("--top-k", type=int, default=-1, help="with K > 1 (default -1: off, verl's)")
    add("--vllm-bin", default=os.environ.get("VLLM_BIN") or str(cfg.ROOT / ".venv/bin/vllm"))
    add("--vllm-args", default=os.environ.get("VLLM_ARGS", ""), help="more 'vllm serve' args")
    add("--server-timeout", type=float, default=900, help="seconds to answer /v1/models (900)")
    return p


def label_of(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"


def parse_model_specs(values: list[str]) -> list[ModelSpec]:
    specs: list[ModelSpec] = []
    for value in values:
        name, sep, source = value.partition("=")
        if not (sep and name and source and "/" not in name):
            name, source = Path(value.rstrip("/")).name or value, value
        label, n = label_of(name), 2
        while label in {s.label for s in specs}:
            label, n = f"{label_of(name)}-{n}", n + 1
        specs.append(ModelSpec(label=label, source=source))
    return specs


def pick_baseline(specs: list[ModelSpec], wanted: str | None) -> str:
    if not specs:
        raise UsageError("no model to evaluate: give --model and/or --api-url with --api-model")
    for spec in specs:
        path, source = (Path(p).expanduser().resolve() for p in (wanted or "", spec.source))
        if wanted in (None, spec.label, spec.source) or path == source:
            return spec.label
    labels = ", ".join(s.label for s in specs)
    raise UsageError(f"--baseline {wanted!r} is none of the evaluated models ({labels})")


def parse_settings(args: argparse.Namespace) -> tuple[Settings, list[ModelSpec], Run | None]:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in cfg.MODES] or ([] if modes else ["(none)"])
    if bad:
        raise UsageError(f"--modes: unknown mode {bad[0]!r}; use {cfg.MODES}")
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
        label = label_of(args.api_model)
        label += "-api" if label in {s.label for s in specs} else ""
        specs.append(ModelSpec(label, args.api_model, api_url=args.api_url.rstrip("/")))
    local = run is not None or any(not s.api_url for s in specs)
    gpu = local and "auto" in (args.backend, args.dtype) and bool(gpus.listed())
    backend = args.backend if args.backend != "auto" else "vllm" if gpu else "transformers"
    if backend == "vllm" and local and not Path(args.vllm_bin).exists():
        raise UsageError(f"--backend vllm: {args.vllm_bin} not found (build the training env "
                         "with 'bash scripts/setup.sh', or set --vllm-bin / VLLM_BIN)")  # fmt: skip
    stamp = cfg.ROOT / "outputs" / f"eval-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out = (args.out or (run.dir / CHECKPOINT_EVAL_DIR if run else stamp)).expanduser().resolve()
    if not run and (out / "comparison.json").exists() and not args.force:
        raise UsageError(f"{out} already holds a comparison (pass --force or another --out)")
    tokens = (cfg.DEFAULT_MAX_TOKENS, cfg.MAX_TOKENS_DEFAULT)
    if args.max_tokens is not None or run:
        tokens = (args.max_tokens, cfg.MAX_TOKENS_FLAG) if args.max_tokens else run.max_tokens()
    sampled = args.samples_per_question > 1
    settings = Settings(
        modes=modes, backend=backend, out=out,
        data=args.data or (run.default_data() if run else cfg.DATA_SOURCE),
        max_tokens=tokens[0], max_tokens_from=tokens[1], limit=args.limit,
        batch_size=args.batch_size, samples=args.samples, api_key=args.api_key,
        dtype=args.dtype if args.dtype != "auto" else "bfloat16" if gpu else "float32",
        repeats=args.samples_per_question, temperature=args.temperature if sampled else 0.0,
        top_p=args.top_p, top_k=args.top_k, vllm_bin=args.vllm_bin,
        vllm_args=shlex.split(args.vllm_args), server_timeout=args.server_timeout,
    )  # fmt: skip
    return settings, specs, run


def check_models(specs: list[ModelSpec], api_key: str) -> None:
    for spec in specs:
        if spec.api_url and (problem := probe_openai(spec.api_url, spec.source, api_key)):
            raise UsageError(f"--api-url {spec.api_url}: {problem}")
        try:
            spec.path = None if spec.api_url else resolve_model_path(spec.source)
        except EvalError as err:
            raise UsageError(f"--model {spec.source}: {err}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the data is copied under --out
    try:  # nothing is written before every input is known good
        settings, specs, run = parse_settings(args)
        baseline = BASELINE if run else pick_baseline(specs, args.baseline)
        earlier = earlier_rows(settings.out, settings.key()) if run else []
        rows = load_data(settings.data, settings.modes)
        check_models(specs, settings.api_key)
    except UsageError as err:
        print(f"{cfg.PROG}: {err}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):  # SystemExit stops the servers
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    session = Session.open(settings, rows)
    if run:
        return run_sweep(run, session, earlier)
    started, results = time.perf_counter(), []
    try:
        for spec in specs:
            results += session.evaluate(spec)
    except (KeyboardInterrupt, SystemExit) as stop:
        exit_interrupted(stop, "no comparison written")
    markdown = session.write(baseline, results, time.perf_counter() - started)
    print(f"\n{markdown}\n{cfg.PROG}: wrote {settings.out / 'comparison.md'} and comparison.json")
    return 1 if any(r.get("error") for r in results) else 0
