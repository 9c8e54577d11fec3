"""A run's checkpoint evaluations (``eval.sh --run``), training mode only."""

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.parse import Series
from verl_gsm8k.common import json_read
from verl_gsm8k.common.run_dir import CHECKPOINT_EVAL_DIR

EVAL_FILE = Path(CHECKPOINT_EVAL_DIR) / "comparison.json"


@dataclass(frozen=True)
class CheckpointEval:
    step: int
    our_reward_accuracy: float | None
    accuracy: float | None
    n: int | None
    model: str


@dataclass
class EvalFile:
    path: Path
    rows: list[CheckpointEval]
    problem: str | None = None


def finite_number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def read_checkpoint_evals(run_dir: Path) -> EvalFile | None:
    path = Path(run_dir) / EVAL_FILE
    if not path.is_file():
        return None
    try:
        results = json_read.read(path)
    except (OSError, json_read.JsonError) as err:
        return EvalFile(path, [], f"not readable JSON ({getattr(err, 'reason', err)})")
    results = results.get("results") if isinstance(results, dict) else None
    if not isinstance(results, list):
        return EvalFile(path, [], 'no "results" list')
    rows: dict[int, CheckpointEval] = {}
    skipped = 0
    for row in results:
        row = row if isinstance(row, dict) else {}
        if row.get("mode", "training") != "training":
            continue
        step, n = row.get("step"), row.get("n")
        ours = finite_number(row.get("our_reward_accuracy"))
        lenient = finite_number(row.get("accuracy"))
        if type(step) is not int or step < 0 or (ours, lenient) == (None, None):
            skipped += 1
            continue
        n = n if type(n) is int else None
        rows[step] = CheckpointEval(step, ours, lenient, n, str(row.get("model", "")))
    why = f"{skipped} rows without a step or an accuracy, skipped" if skipped else None
    return EvalFile(path, [rows[s] for s in sorted(rows)], why)


def eval_series(rows: list[CheckpointEval]) -> tuple[Series, Series]:
    ours = [(r.step, r.our_reward_accuracy) for r in rows if r.our_reward_accuracy is not None]
    return ours, [(r.step, r.accuracy) for r in rows if r.accuracy is not None]


def evals_summary(evals: EvalFile | None, val: Series) -> dict[str, Any] | None:
    if evals is None:
        return None
    logged = dict(val)
    pairs = [{"step": s, "verl_validation": logged[s], "our_reward": v, "gap": v - logged[s]}
             for s, v in eval_series(evals.rows)[0] if s in logged]  # fmt: skip
    top = max(pairs, key=lambda p: abs(p["gap"])) if pairs else None
    text = (f"our reward vs verl validation at {len(pairs)} shared steps: largest gap "
            f"{top['gap'] * 100:+.1f} points (step {top['step']})" if top else
            "no evaluated checkpoint has a verl validation at its step")  # fmt: skip
    return {"file": str(evals.path), "rows": [asdict(row) for row in evals.rows],
            "agreement": {"steps": pairs, "largest_gap": top}, "agreement_text": text,
            "problem": evals.problem}  # fmt: skip
