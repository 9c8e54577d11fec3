"""Checkpoint evaluations of a run beside verl's validation curve.

``RUN_DIR/checkpoint_eval/comparison.json`` (written by the evaluation of a run's checkpoints,
the format of ``verl_gsm8k/evaluate``'s comparison.json plus a ``step`` per row):

    {"results": [{"step": 0, "model": "...", "mode": "training", "accuracy": 0.41,
                  "our_reward_accuracy": 0.38, "n": 100, ...}, ...]}

One row per evaluated checkpoint, step 0 being the starting model. ``accuracy`` is EvalScope's
lenient score; ``our_reward_accuracy`` is our reward on the same responses, the number verl's
validation reports during training, so the two curves should agree when the validation set and
generation settings match. Rows of another mode (EvalScope's own prompt) have no reward score
and are left out. Standard library only; used by the run report and the run comparison (the
chart itself is drawn in ``runpage/html.py``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.parse import Series
from verl_gsm8k.common import json_read
from verl_gsm8k.common.run_dir import CHECKPOINT_EVAL_DIR

EVAL_FILE = Path(CHECKPOINT_EVAL_DIR) / "comparison.json"
TRAINING_MODE = "training"


@dataclass(frozen=True)
class CheckpointEval:
    """One evaluated checkpoint: its step and its two accuracies (None when not scored)."""

    step: int
    our_reward_accuracy: float | None
    accuracy: float | None
    n: int | None
    model: str


@dataclass
class EvalFile:
    """What a run's checkpoint_eval/comparison.json holds; ``problem`` says why rows are missing."""

    path: Path
    rows: list[CheckpointEval]
    problem: str | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_checkpoint_evals(run_dir: Path) -> EvalFile | None:
    """The run's checkpoint evaluations in step order; None when the run has none (no file).

    A file that is not the expected JSON gives an EvalFile with no rows and a ``problem``: the
    report goes on without the evaluations and says why.
    """
    path = Path(run_dir) / EVAL_FILE
    if not path.is_file():
        return None
    try:
        payload = json_read.read(path)
    except OSError as exc:
        return EvalFile(path, [], f"not readable ({exc})")
    except json_read.JsonError as exc:
        return EvalFile(path, [], f"not readable JSON ({exc.reason})")
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list):
        return EvalFile(path, [], 'no "results" list')
    by_step: dict[int, CheckpointEval] = {}
    skipped = 0
    for row in results:
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            skipped += 1
            continue
        if row.get("mode", TRAINING_MODE) != TRAINING_MODE:
            continue  # EvalScope's own prompt: no reward score, not what verl validates
        ours, lenient = _number(row.get("our_reward_accuracy")), _number(row.get("accuracy"))
        if ours is None and lenient is None:
            skipped += 1  # a failed evaluation
            continue
        n = row.get("n")
        by_step[step] = CheckpointEval(
            step, ours, lenient, n if isinstance(n, int) else None, str(row.get("model", ""))
        )
    problem = f"{skipped} rows without a step or an accuracy, skipped" if skipped else None
    return EvalFile(path, [by_step[s] for s in sorted(by_step)], problem)


def agreement(rows: list[CheckpointEval], val: Series) -> dict[str, Any]:
    """Our reward on each checkpoint against verl's validation accuracy at the same step."""
    logged = dict(val)
    pairs = [
        {
            "step": r.step,
            "verl_validation": logged[r.step],
            "our_reward": r.our_reward_accuracy,
            "gap": r.our_reward_accuracy - logged[r.step],
        }
        for r in rows
        if r.our_reward_accuracy is not None and r.step in logged
    ]
    largest = max(pairs, key=lambda p: abs(p["gap"])) if pairs else None
    return {"steps": pairs, "largest_gap": largest}


def agreement_text(agree: dict[str, Any]) -> str:
    """One sentence: do our reward on the checkpoints and verl's validation agree?"""
    pairs, largest = agree["steps"], agree["largest_gap"]
    if not pairs:
        return "no evaluated checkpoint has a verl validation at its step to compare with"
    return (
        f"our reward vs verl validation at {len(pairs)} shared steps: largest gap "
        f"{largest['gap'] * 100:+.1f} points (step {largest['step']})"
    )


def eval_series(rows: list[CheckpointEval]) -> tuple[Series, Series]:
    """(our reward by step, EvalScope's lenient accuracy by step)."""
    ours = [(r.step, r.our_reward_accuracy) for r in rows if r.our_reward_accuracy is not None]
    lenient = [(r.step, r.accuracy) for r in rows if r.accuracy is not None]
    return ours, lenient


def evals_summary(evals: EvalFile | None, val: Series) -> dict[str, Any] | None:
    """summary.json's checkpoint_evals: the file, its rows, and how they agree with validation."""
    if evals is None:
        return None
    agree = agreement(evals.rows, val)
    return {
        "file": str(evals.path),
        "rows": [asdict(row) for row in evals.rows],
        "agreement": agree,
        "agreement_text": agreement_text(agree),
        "problem": evals.problem,
    }
