"""``eval.sh --run RUN_DIR``: step 0 and every kept checkpoint, one at a time; comparison.json
rewritten after each; a rerun adds what it lacks."""

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common import run_dir as layout
from verl_gsm8k.common.launch_record import RecordError, lookup, read_record
from verl_gsm8k.evaluate.run import Session, exit_interrupted
from verl_gsm8k.evaluate.server import resolve_model_path
from verl_gsm8k.evaluate.settings import PROG, ROOT, EvalError, ModelSpec, UsageError

BASELINE = "step-0"
LENGTH = "data.max_response_length"


@dataclass
class Run:
    dir: Path
    records: list[Path]  # oldest first
    configs: list[dict[str, Any]]

    @classmethod
    def read(cls, path: Path) -> "Run":
        run = path.expanduser().resolve()
        if not run.is_dir():
            raise UsageError(f"--run {path}: not a directory")
        if not (records := layout.launch_record_paths(run)):
            raise UsageError(f"--run {run}: no launch record (launches/launch-*.yaml), so its "
                             "starting model is unknown; merge checkpoints with scripts/merge.sh "
                             "and evaluate them with --model")  # fmt: skip
        try:
            return cls(run, records, [read_record(p)["config"] for p in records])
        except RecordError as err:
            raise UsageError(f"--run {run}: {err}") from None

    def default_data(self) -> str:
        """The directory of the run's validation file."""
        files = lookup(self.configs[0], "data.val_files")
        first = files[0] if isinstance(files, list) and files else files
        if not isinstance(first, str) or not Path(first).is_file():
            raise UsageError(f"--run {self.dir}: its validation file {first!r} is not here; "
                             "pass --data")  # fmt: skip
        return str(Path(first).parent)

    def max_tokens(self) -> tuple[int, str]:
        """The response limit of the run's last launch, and where it was read."""
        value = lookup(self.configs[-1], LENGTH)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{self.records[-1]}: {LENGTH} is {value!r}, not a positive "
                             "integer; pass --max-tokens")  # fmt: skip
        return value, f"{LENGTH} of the run's launch record {self.records[-1]}"


def earlier_rows(out: Path, key: dict[str, Any]) -> list[dict]:
    """An earlier sweep's finished rows; other settings: UsageError."""
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
        raise UsageError(f"{out} holds a sweep with other settings ({'; '.join(differ)}): its "
                         "rows would mix with these; pass another --out, or remove it to start "
                         "over")  # fmt: skip
    return [r for r in old.get("results", []) if r.get("error") is None and "step" in r]


def kept_best(run_dir: Path) -> dict[str, Any] | None:
    try:
        return layout.read_best(run_dir)
    except layout.BestError as err:
        print(f"{PROG}: warning: {err}; the kept best checkpoint is not marked", file=sys.stderr)
        return None


def merged(run_dir: Path, step: int, target: Path) -> str:
    """The step merged by scripts/merge.sh."""
    shutil.rmtree(target, ignore_errors=True)
    source = layout.step_dir(run_dir, step)
    cmd = ["bash", str(ROOT / "scripts/merge.sh"), str(source), str(target)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EvalError(f"merging {source.name} failed: {tail[0]}")
    return str(target)


def run_sweep(run: Run, session: Session, results: list[dict]) -> int:
    """Every step not among ``results``, in step order."""
    s, best, started = session.settings, kept_best(run.dir), time.perf_counter()
    start_model = str(lookup(run.configs[0], "actor_rollout_ref.model.path"))
    done = {r["step"] for r in results}
    todo = [step for step in [0, *layout.saved_steps(run.dir)] if step not in done]
    print(f"{PROG}: {run.dir}: steps evaluated earlier {sorted(done)}, to evaluate {todo}",
          flush=True)  # fmt: skip

    def write(results: list[dict]) -> None:
        results.sort(key=lambda r: (r["step"], r["mode"]))
        steps = sorted({r["step"] for r in results})
        sweep = {"run_dir": str(run.dir), "starting_model": start_model, "settings": s.key(),
                 "steps": steps, "best_checkpoint": best}  # fmt: skip
        session.write(BASELINE, results, time.perf_counter() - started, sweep)

    for step in todo:
        spec, target = ModelSpec(f"step-{step}", start_model), s.out / f".merge-step-{step}"
        try:
            if step:
                spec.source = spec.path = merged(run.dir, step, target)
            else:
                spec.path = resolve_model_path(start_model)
            rows = session.evaluate(spec)
        except EvalError as err:
            rows = [session.row(spec, s.backend, mode, str(err)) for mode in s.modes]
        except (KeyboardInterrupt, SystemExit) as stop:
            shutil.rmtree(target, ignore_errors=True)
            exit_interrupted(stop, "steps finished before are kept")
        shutil.rmtree(target, ignore_errors=True)
        results = [r for r in results if r["step"] != step] + [{**r, "step": step} for r in rows]
        write(results)
    if not todo:
        write(results)
    print(f"{PROG}: accuracy by step -> {s.out / 'comparison.md'} and comparison.json")
    return 1 if any(r.get("error") for r in results) else 0
