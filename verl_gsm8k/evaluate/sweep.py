"""Every kept checkpoint of a run, evaluated the same way: ``bash scripts/eval.sh --run RUN_DIR``.

The starting model (``actor_rollout_ref.model.path`` of the run's first launch record,
``RUN_DIR/launches/``) is step 0; each step directory is merged by ``scripts/merge.sh`` (in the
training environment, where verl's merger is) into a temporary directory under the output,
evaluated in the same mode, on the same data and with the same generation settings as every other
step, and the merge removed. The maximum new tokens are the run's own
``data.max_response_length`` (its last launch record), so a step's score compares with verl's
validation of that step (verl cuts an answer there and scores it 0); ``--max-tokens`` overrides
it, and the page says which. The data default to the directory of the run's own validation file
(``data.val_files``): the sweep scores the questions verl validated on. Output, by default
``RUN_DIR/checkpoint_eval/``: ``comparison.json`` (a row per step and mode, each with its
``step``; the run report and the run comparison draw it beside verl's validation curve) and
``comparison.md`` (accuracy by step), rewritten after every step, so an interrupted sweep keeps
what it finished. Run again, it resumes: steps already evaluated with the same settings (every
generation setting, ``settings_key``) are kept; another setting is refused in one line naming
it. The run's kept best checkpoint (``best_checkpoint.json``, KEEP_BEST=1:
verl_gsm8k/common/run_dir.py) is marked in the table and recorded as ``sweep.best_checkpoint``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common.launch_record import RecordError, lookup, read_record, read_records
from verl_gsm8k.common.run_dir import (
    BEST_FILE,
    CHECKPOINT_EVAL_DIR,
    LAUNCH_RECORD,
    LAUNCHES_DIR,
    BestError,
    launch_record_paths,
    read_best,
    saved_steps,
    step_dir,
    step_name,
)
from verl_gsm8k.evaluate.render import pct, render_markdown
from verl_gsm8k.evaluate.scoring import add_deltas
from verl_gsm8k.evaluate.server import resolve_model_path
from verl_gsm8k.evaluate.session import Session, exit_interrupted, read_rows, write_comparison
from verl_gsm8k.evaluate.settings import (
    PROG,
    REPETITION_PENALTY,
    ROOT,
    EvalError,
    ModelSpec,
    Settings,
    UsageError,
)

MERGE_PREFIX = ".merge-step-"
RECORDS = f"{LAUNCHES_DIR}/{LAUNCH_RECORD.format(stamp='*')}"  # named in messages
BASELINE = "step-0"


def run_config(run_dir: Path) -> dict[str, Any]:
    """The config of the run's first launch: the model it started from is step 0."""
    if not run_dir.is_dir():
        raise UsageError(f"--run {run_dir}: not a directory")
    try:
        records = read_records(run_dir)
    except RecordError as err:
        raise UsageError(f"--run {run_dir}: {err}") from None
    if not records:
        raise UsageError(
            f"--run {run_dir}: no launch record ({RECORDS}), so its starting model "
            "is unknown; merge checkpoints with scripts/merge.sh and evaluate them with --model"
        )
    return records[0]["config"]


def default_data(config: dict[str, Any], run_dir: Path) -> str:
    files = lookup(config, "data.val_files")
    first = files[0] if isinstance(files, list) and files else files
    if not isinstance(first, str) or not Path(first).is_file():
        raise UsageError(f"--run {run_dir}: its validation file {first!r} is not here; pass --data")
    return str(Path(first).parent)


RESPONSE_LENGTH = "data.max_response_length"


def run_max_tokens(run_dir: Path) -> tuple[int, str]:
    """The run's response limit (``data.max_response_length`` of its last launch record: the
    length its latest checkpoints were trained and validated at) and where it was read."""
    paths = launch_record_paths(run_dir)
    if not paths:
        raise UsageError(f"--run {run_dir}: no launch record ({RECORDS})")
    try:
        config = read_record(paths[-1])["config"]
    except RecordError as err:
        raise UsageError(f"--run {run_dir}: {err}") from None
    value = lookup(config, RESPONSE_LENGTH)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(
            f"{paths[-1]}: {RESPONSE_LENGTH} is {value!r}, not a positive integer; pass "
            "--max-tokens"
        )
    return value, f"{RESPONSE_LENGTH} of the run's launch record {paths[-1]}"


def sweep_settings(
    args: argparse.Namespace, settings_for: Callable[[argparse.Namespace], Settings]
) -> Settings:
    """The single-model command's settings, with the run's response limit unless --max-tokens
    was given."""
    settings = settings_for(args)
    if args.max_tokens is None:
        tokens, source = run_max_tokens(args.run.expanduser().resolve())
        settings = dataclasses.replace(settings, max_tokens=tokens, max_tokens_from=source)
    return settings


def settings_key(settings: Settings, data: str) -> dict[str, Any]:
    """What must be equal for a step evaluated earlier to count as done: the data and every
    setting that changes an answer or its score (not where max_tokens came from)."""
    sampled = settings.repeats > 1
    return {
        "modes": list(settings.modes), "data": data, "limit": settings.limit,
        "max_tokens": settings.max_tokens, "samples_per_question": settings.repeats,
        "temperature": settings.temperature, "top_p": settings.top_p if sampled else None,
        "top_k": settings.top_k if sampled else None, "repetition_penalty": REPETITION_PENALTY,
        "backend": settings.backend, "dtype": settings.dtype,
    }  # fmt: skip


def earlier_rows(out: Path, key: dict[str, Any]) -> list[dict]:
    """The finished rows of an earlier sweep into ``out`` with the same settings; an earlier
    sweep with another setting is refused, in one line naming each setting that differs."""
    path = out / "comparison.json"
    if not path.is_file():
        return []
    try:
        old = json_read.read(path)
    except (OSError, json_read.JsonError):
        raise UsageError(f"{path} is not readable JSON: remove it or pass another --out") from None
    settings = (old.get("sweep") or {}).get("settings") or {}
    differ = [
        f"{name} {settings.get(name, 'unrecorded')!r} there, {key.get(name)!r} now"
        for name in sorted(set(key) | set(settings))
        if settings.get(name, "unrecorded") != key.get(name, "unrecorded")
    ]
    if differ:
        raise UsageError(
            f"{out} holds a sweep with other settings ({'; '.join(differ)}): its rows would mix "
            "with these; pass another --out, or remove it to start over"
        )
    return [r for r in old.get("results", []) if r.get("error") is None and "step" in r]


def merge_checkpoint(run_dir: Path, step: int, target: Path) -> None:
    """scripts/merge.sh (it runs in the training environment, which has verl's merger)."""
    shutil.rmtree(target, ignore_errors=True)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "merge.sh"), str(step_dir(run_dir, step)),
         str(target)], capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EvalError(f"merging {step_name(step)} failed: {tail[0]}")


def kept_best(run_dir: Path) -> dict[str, Any] | None:
    """The run's best_checkpoint.json; None without one (an unreadable one: one line, unmarked)."""
    try:
        return read_best(run_dir)
    except BestError as err:
        print(f"{PROG}: warning: {err}; the kept best checkpoint is not marked", file=sys.stderr)
        return None


def best_label(best: dict[str, Any]) -> str:
    """``best (val acc 0.57)``: verl's validation accuracy by a short name, another metric by its
    own."""
    metric = str(best.get("metric", ""))
    name = "val acc" if metric.startswith("val-core/") and "/acc/" in metric else metric
    return f"best ({name} {best['value']:.4g})"


def render_steps(summary: dict) -> str:
    sweep = summary["sweep"]
    best = sweep.get("best_checkpoint")
    lines = [
        f"# Checkpoints of {sweep['run_dir']}",
        "",
        f"Step 0 is the starting model, `{sweep['starting_model']}`; every checkpoint was merged "
        "and evaluated the same way (settings below). Accuracy % by step:",
        "",
        "| step | mode | accuracy % (EvalScope) | our reward acc % | n |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in summary["results"]:
        step = (
            f"{r['step']} {best_label(best)}" if best and r["step"] == best["step"] else r["step"]
        )
        if r.get("error"):
            lines.append(f"| {step} | {r['mode']} | failed: {r['error'][:90]} | | |")
        else:
            lines.append(
                f"| {step} | {r['mode']} | {pct(r.get('accuracy'))} "
                f"| {pct(r.get('our_reward_accuracy'))} | {r.get('n')} |"
            )
    if best:
        lines += ["", f"The run's kept best checkpoint (`{BEST_FILE}`): step "
                  f"{best['step']}, {best.get('metric')} = {best['value']:.4g}; "
                  f"`bash scripts/merge.sh {sweep['run_dir']} OUT --best` merges it."]  # fmt: skip
    return "\n".join(lines) + "\n\n"


def run_sweep(
    args: argparse.Namespace, settings_for: Callable[[argparse.Namespace], Settings]
) -> int:
    """``eval.sh --run``: ``settings_for`` is the single-model command's own parsing (cli.py)."""
    run_dir = args.run.expanduser().resolve()
    config = run_config(run_dir)
    start_model = str(lookup(config, "actor_rollout_ref.model.path"))
    args.data = args.data or default_data(config, run_dir)
    args.out = args.out or run_dir / CHECKPOINT_EVAL_DIR
    args.force = True  # an earlier sweep here is resumed (its settings are checked), not refused
    settings = sweep_settings(args, settings_for)
    key = settings_key(settings, args.data)
    best = kept_best(run_dir)
    results = earlier_rows(settings.out, key)
    done = {r["step"] for r in results}
    todo = [step for step in [0, *saved_steps(run_dir)] if step not in done]
    session = Session.open(settings, args.data, read_rows(args.data, settings.modes))
    print(f"{PROG}: {run_dir}: steps evaluated earlier {sorted(done)}, to evaluate {todo}",
          flush=True)  # fmt: skip
    started = time.perf_counter()
    for step in todo:
        spec = ModelSpec(label=f"step-{step}", source=start_model)
        merged = settings.out / f"{MERGE_PREFIX}{step}"
        try:
            if step == 0:
                spec.path = resolve_model_path(start_model)
            else:
                merge_checkpoint(run_dir, step, merged)
                spec.source = spec.path = str(merged)
            rows = session.evaluate(spec)
        except EvalError as err:
            rows = [{"model": spec.label, "mode": mode, "error": str(err)}
                    for mode in settings.modes]  # fmt: skip
        except (KeyboardInterrupt, SystemExit) as stop:
            shutil.rmtree(merged, ignore_errors=True)
            exit_interrupted(stop, "steps finished before are kept")
        shutil.rmtree(merged, ignore_errors=True)
        results = [r for r in results if r["step"] != step] + [dict(r, step=step) for r in rows]
        write(session, run_dir, start_model, key, results, time.perf_counter() - started, best)
    if not todo:
        write(session, run_dir, start_model, key, results, 0.0, best)
    print(f"{PROG}: accuracy by step -> {settings.out / 'comparison.md'} and comparison.json")
    return 1 if any(r.get("error") for r in results) else 0


def write(session: Session, run_dir: Path, start_model: str, key: dict[str, Any],
          results: list[dict], seconds: float, best: dict[str, Any] | None) -> None:  # fmt: skip
    results.sort(key=lambda r: (r["step"], r["mode"]))
    add_deltas(results, BASELINE)
    summary = session.summary(BASELINE, results, seconds)
    summary["sweep"] = {"run_dir": str(run_dir), "starting_model": start_model, "settings": key,
                        "steps": sorted({r["step"] for r in results}),
                        "best_checkpoint": best}  # fmt: skip
    write_comparison(
        session.settings.out, summary, render_steps(summary) + render_markdown(summary)
    )
