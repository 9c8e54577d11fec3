"""``eval.sh --run RUN_DIR``: the run's starting model (step 0, its first launch record's
``actor_rollout_ref.model.path``) and every kept checkpoint, each merged by scripts/merge.sh (in
the training environment, where verl's merger is) into a temporary directory, evaluated the same
way, the merge removed. comparison.json/.md (accuracy by step) are rewritten after every step,
so an interrupted sweep keeps what it finished; a rerun evaluates only the steps it lacks, and is
refused where a setting that changes an answer differs (``Settings.key``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common.launch_record import RecordError, lookup, read_record
from verl_gsm8k.common.run_dir import (
    BEST_FILE,
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
from verl_gsm8k.evaluate.run import Session, exit_interrupted, write_comparison
from verl_gsm8k.evaluate.scoring import add_deltas
from verl_gsm8k.evaluate.server import resolve_model_path
from verl_gsm8k.evaluate.settings import PROG, ROOT, EvalError, ModelSpec, UsageError

BASELINE = "step-0"
RESPONSE_LENGTH = "data.max_response_length"


@dataclass
class Run:
    dir: Path
    records: list[Path]  # its launch records, oldest first

    @classmethod
    def read(cls, path: Path) -> Run:
        run = path.expanduser().resolve()
        if not run.is_dir():
            raise UsageError(f"--run {path}: not a directory")
        records = launch_record_paths(run)
        if not records:
            raise UsageError(
                f"--run {run}: no launch record ({LAUNCHES_DIR}/{LAUNCH_RECORD.format(stamp='*')})"
                ", so its starting model is unknown; merge checkpoints with scripts/merge.sh and "
                "evaluate them with --model"
            )
        return cls(run, records)

    def config(self, last: bool = False) -> dict[str, Any]:
        try:
            return read_record(self.records[-1 if last else 0])["config"]
        except RecordError as err:
            raise UsageError(f"--run {self.dir}: {err}") from None

    def default_data(self) -> str:
        """The directory of the run's validation file: the questions verl validated on."""
        files = lookup(self.config(), "data.val_files")
        first = files[0] if isinstance(files, list) and files else files
        if not isinstance(first, str) or not Path(first).is_file():
            raise UsageError(f"--run {self.dir}: its validation file {first!r} is not here; "
                             "pass --data")  # fmt: skip
        return str(Path(first).parent)

    def max_tokens(self) -> tuple[int, str]:
        """The response limit its latest checkpoints were trained and validated at (the last
        launch record's), and where it was read."""
        value = lookup(self.config(last=True), RESPONSE_LENGTH)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{self.records[-1]}: {RESPONSE_LENGTH} is {value!r}, not a "
                             "positive integer; pass --max-tokens")  # fmt: skip
        return value, f"{RESPONSE_LENGTH} of the run's launch record {self.records[-1]}"


def earlier_rows(out: Path, key: dict[str, Any]) -> list[dict]:
    """The finished rows of an earlier sweep into ``out`` with the same settings; one with
    another is refused in one line naming each setting that differs."""
    path = out / "comparison.json"
    if not path.is_file():
        return []
    try:
        old = json_read.read(path)
    except (OSError, json_read.JsonError):
        raise UsageError(f"{path} is not readable JSON: remove it or pass another --out") from None
    was = (old.get("sweep") or {}).get("settings") or {}
    differ = [f"{name} {was.get(name, 'unrecorded')!r} there, {key.get(name)!r} now"
              for name in sorted(set(key) | set(was))
              if was.get(name, "unrecorded") != key.get(name, "unrecorded")]  # fmt: skip
    if differ:
        raise UsageError(
            f"{out} holds a sweep with other settings ({'; '.join(differ)}): its rows would mix "
            "with these; pass another --out, or remove it to start over"
        )
    return [r for r in old.get("results", []) if r.get("error") is None and "step" in r]


def kept_best(run_dir: Path) -> dict[str, Any] | None:
    """The run's best_checkpoint.json; None without one (an unreadable one: one line)."""
    try:
        return read_best(run_dir)
    except BestError as err:
        print(f"{PROG}: warning: {err}; the kept best checkpoint is not marked", file=sys.stderr)
        return None


def render_steps(summary: dict) -> str:
    sweep = summary["sweep"]
    best = sweep.get("best_checkpoint")
    lines = [
        f"# Checkpoints of {sweep['run_dir']}", "",
        f"Step 0 is the starting model, `{sweep['starting_model']}`; every checkpoint was merged "
        "and evaluated the same way (settings below). Accuracy % by step:", "",
        "| step | mode | accuracy % (EvalScope) | our reward acc % | n |",
        "|---:|---|---:|---:|---:|",
    ]  # fmt: skip
    if best:
        metric = str(best.get("metric", ""))
        name = "val acc" if metric.startswith("val-core/") and "/acc/" in metric else metric
        mark = f"best ({name} {best['value']:.4g})"
    for r in summary["results"]:
        step = f"{r['step']} {mark}" if best and r["step"] == best["step"] else r["step"]
        lines.append(
            f"| {step} | {r['mode']} | failed: {r['error'][:90]} | | |" if r.get("error") else
            f"| {step} | {r['mode']} | {pct(r.get('accuracy'))} "
            f"| {pct(r.get('our_reward_accuracy'))} | {r.get('n')} |"
        )  # fmt: skip
    if best:
        lines += ["", f"The run's kept best checkpoint (`{BEST_FILE}`): step {best['step']}, "
                  f"{best.get('metric')} = {best['value']:.4g}; `bash scripts/merge.sh "
                  f"{sweep['run_dir']} OUT --best` merges it."]  # fmt: skip
    return "\n".join(lines) + "\n\n"


def merge_checkpoint(run_dir: Path, step: int, target: Path) -> None:
    """scripts/merge.sh: it runs in the training environment, which has verl's merger."""
    shutil.rmtree(target, ignore_errors=True)
    cmd = ["bash", str(ROOT / "scripts/merge.sh"), str(step_dir(run_dir, step)), str(target)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EvalError(f"merging {step_name(step)} failed: {tail[0]}")


def run_sweep(run: Run, session: Session, results: list[dict]) -> int:
    """Every step not among ``results`` (the earlier sweep's rows), in step order."""
    s, best = session.settings, kept_best(run.dir)
    start_model = str(lookup(run.config(), "actor_rollout_ref.model.path"))
    done = {r["step"] for r in results}
    todo = [step for step in [0, *saved_steps(run.dir)] if step not in done]
    print(f"{PROG}: {run.dir}: steps evaluated earlier {sorted(done)}, to evaluate {todo}",
          flush=True)  # fmt: skip
    started = time.perf_counter()

    def write() -> None:
        results.sort(key=lambda r: (r["step"], r["mode"]))
        add_deltas(results, BASELINE)
        summary = session.summary(BASELINE, results, time.perf_counter() - started)
        summary["sweep"] = {"run_dir": str(run.dir), "starting_model": start_model,
                            "settings": s.key(), "steps": sorted({r["step"] for r in results}),
                            "best_checkpoint": best}  # fmt: skip
        write_comparison(s.out, summary, render_steps(summary) + render_markdown(summary))

    for step in todo:
        spec = ModelSpec(label=f"step-{step}", source=start_model)
        merged = s.out / f".merge-step-{step}"
        try:
            if step == 0:
                spec.path = resolve_model_path(start_model)
            else:
                merge_checkpoint(run.dir, step, merged)
                spec.source = spec.path = str(merged)
            rows = session.evaluate(spec)
        except EvalError as err:
            rows = [session.row(spec, s.backend, mode, str(err)) for mode in s.modes]
        except (KeyboardInterrupt, SystemExit) as stop:
            shutil.rmtree(merged, ignore_errors=True)
            exit_interrupted(stop, "steps finished before are kept")
        shutil.rmtree(merged, ignore_errors=True)
        results[:] = [r for r in results if r["step"] != step] + [dict(r, step=step) for r in rows]
        write()
    if not todo:
        write()
    print(f"{PROG}: accuracy by step -> {s.out / 'comparison.md'} and comparison.json")
    return 1 if any(r.get("error") for r in results) else 0
