"""Evaluate models on the GSM8K test split with EvalScope, in two prompt modes, and compare them.

Run it through ``bash scripts/eval.sh`` (it uses the EvalScope environment, .venv-eval, which
must stay apart from verl's: EvalScope >= 1.13 needs antlr4 4.13, verl's Hydra 4.9).

Modes (``--modes``, both by default):

* ``training``: zero-shot, the prompt is exactly the training prompt
  (``data_prep.gsm8k.PROMPT_STYLES["hash"]``). The saved predictions are also re-scored with our
  training reward (``rewards/gsm8k.py:compute_score``), and both accuracies are reported. The
  score compares with verl's validation score only at the run's own response limit
  (``data.max_response_length``): ``--run`` takes it from the run's launch record, otherwise
  ``--max-tokens`` (default 1024) applies, and the page says which.
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

This file is the command line (``python -m verl_gsm8k.evaluate``, which eval.sh runs); the work is
in ``data`` (data preparation), ``server`` (models, the vLLM server and its probe), ``run``
(EvalScope runs), ``scoring`` (reading and re-scoring EvalScope's outputs) and ``render`` (tables
and samples), with what they share in ``common``, all in ``verl_gsm8k/evaluate/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import signal
import sys
import time
from pathlib import Path

from verl_gsm8k.common.run_dir import STEP_N
from verl_gsm8k.evaluate.render import render_markdown
from verl_gsm8k.evaluate.scoring import add_deltas
from verl_gsm8k.evaluate.server import has_gpu, probe_openai, resolve_model_path
from verl_gsm8k.evaluate.session import Session, exit_interrupted, read_rows, write_comparison
from verl_gsm8k.evaluate.settings import (
    DATA_SOURCE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SAMPLES,
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
from verl_gsm8k.evaluate.sweep import run_sweep

# ---------------------------------------------------------------------------------------------
# Models on the command line


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


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    """The command line: one helper per group of arguments, added in the order --help lists them."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Evaluate models on GSM8K (test split) with EvalScope in two prompt modes "
        "and write comparison.md/.json. Example: bash scripts/eval.sh --model "
        "Qwen/Qwen2.5-0.5B-Instruct --model ppo=merged/best --data ~/data/gsm8k",
    )
    _add_model_arguments(parser)
    _add_api_arguments(parser)
    _add_data_arguments(parser)
    _add_output_arguments(parser)
    _add_sampling_arguments(parser)
    _add_vllm_arguments(parser)
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """What to evaluate: the models, the baseline, the prompt modes and the backend."""
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


def _add_api_arguments(parser: argparse.ArgumentParser) -> None:
    """An OpenAI-compatible server already running, evaluated instead of or beside local models."""
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


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """A run's checkpoints, the questions and how they are asked: data, limit, answer length,
    batch, dtype."""
    parser.add_argument(
        "--run",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help=f"evaluate every kept checkpoint of a PPO/GRPO run ({STEP_N}, merged one at a "
        "time by scripts/merge.sh into a temporary directory) and its starting model (step 0, "
        "MODEL_PATH from its launch record), in the same mode, on the same data (default: the "
        "run's validation data); writes accuracy by step to RUN_DIR/checkpoint_eval/ (or --out) "
        "and resumes: steps evaluated earlier with the same settings are kept",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="GSM8K source: a hub dataset id, or a directory with train.jsonl/test.jsonl, the "
        "hub parquet layout (main/test-00000-of-00001.parquet) or data_prep's "
        "train.parquet/test.parquet. It is copied in the hub layout under --out; EvalScope "
        f"never downloads it (default: {DATA_SOURCE}; with --run, the run's validation data)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="evaluate only the first N test questions (EvalScope's limit; for quick runs)",
    )
    parser.add_argument(
        MAX_TOKENS_FLAG,
        type=int,
        default=None,
        help="maximum new tokens per answer. Default: with --run, the run's own "
        "data.max_response_length from its launch record (verl validated at that length and "
        f"scored a cut answer 0); otherwise {DEFAULT_MAX_TOKENS}. comparison.md says which was "
        "used and where it came from",
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


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the comparison is written, and how many samples it shows."""
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


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """K sampled answers per question instead of one greedy answer, and how they are sampled."""
    parser.add_argument(
        "--samples-per-question",
        type=int,
        default=1,
        metavar="K",
        help="sample K answers per question (EvalScope repeats) at --temperature instead of one "
        "greedy answer: accuracy is then mean@K (over every answer) and pass@K is reported "
        "beside it, by EvalScope and by our reward (default 1: greedy)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature with --samples-per-question > 1 (default 1.0, verl's "
        "rollout temperature); greedy evaluation ignores it",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="nucleus sampling with --samples-per-question > 1 (default 1.0: off, as verl's "
        "rollout); sent explicitly, since otherwise the server takes the model's "
        "generation_config.json (Qwen2.5-Instruct: 0.8)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=-1,
        help="top-k sampling with --samples-per-question > 1 (default -1: off, as verl's "
        "rollout); sent explicitly, since otherwise the server takes the model's "
        "generation_config.json (Qwen2.5-Instruct: 20)",
    )


def _add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """The vLLM server the vllm backend starts for each local model."""
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


def parse_settings(args: argparse.Namespace) -> tuple[Settings, list[ModelSpec]]:
    import shlex

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"--modes: unknown mode {bad[0] if bad else '(none)'!r}; use {MODES}")
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
        max_tokens=DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens,
        max_tokens_from=MAX_TOKENS_DEFAULT if args.max_tokens is None else MAX_TOKENS_FLAG,
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
        repeats=args.samples_per_question,
        temperature=args.temperature if args.samples_per_question > 1 else 0.0,
        top_p=args.top_p,
        top_k=args.top_k,
    )
    return settings, specs


def check_models(specs: list[ModelSpec], settings: Settings) -> None:
    """Resolve every local model (``spec.path``) and probe every ``--api-url``, or raise
    UsageError naming the first one that is wrong."""
    for spec in specs:
        if spec.api_url:
            problem = probe_openai(spec.api_url, spec.source, settings.api_key)
            if problem:
                raise UsageError(f"--api-url {spec.api_url}: {problem}")
        else:
            try:
                spec.path = resolve_model_path(spec.source)
            except EvalError as err:
                raise UsageError(f"--model {spec.source}: {err}") from None


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through every finally/with: servers are stopped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the data is always local by now
    if args.run is not None:
        try:
            if args.model or args.api_url:
                raise UsageError("--run evaluates a run's checkpoints: not with --model/--api-url")
            return run_sweep(args, lambda a: parse_settings(a)[0])
        except UsageError as err:
            print(f"{PROG}: {err}", file=sys.stderr)
            return 2
    args.data = args.data or DATA_SOURCE
    try:
        settings, specs = parse_settings(args)
        baseline = pick_baseline(specs, args.baseline)
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    # Everything the user named is checked before anything is written: a typo must not leave
    # an --out directory behind (its re-run would be refused without --force).
    try:
        rows = read_rows(args.data, settings.modes)
        check_models(specs, settings)
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2

    session = Session.open(settings, args.data, rows)
    results: list[dict] = []
    try:
        for spec in specs:
            results += session.evaluate(spec)
    except (KeyboardInterrupt, SystemExit) as stop:
        exit_interrupted(stop, "no comparison written")
    add_deltas(results, baseline)
    summary = session.summary(baseline, results, time.perf_counter() - started)
    write_comparison(settings.out, summary, render_markdown(summary))
    print(
        f"\n{render_markdown(summary)}\n{PROG}: wrote {settings.out / 'comparison.md'} and "
        "comparison.json"
    )
    return 1 if any(r.get("error") for r in results) else 0
