"""The questions page of one or several run directories, for the run report and the comparison."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from verl_gsm8k.common.run_dir import VALIDATION_DIR

from .page import write
from .table import Column, InputError, NotFiniteError, build, load_validation

DIR_NAME = "questions"  # the page's folder beside report.html / comparison.html
# Which validation steps of a run become columns (run_columns).
STEPS = ("all", "last", "best")
# The evaluation mode whose reviews make an evaluation's page: the training prompt, as verl's
# validation sees it (verl_gsm8k/evaluate/run.py, mode_settings).
PREFERRED_MODE = "training"


def validation_steps(run_dir: Path) -> list[Path]:
    """RUN_DIR/validation/<step>.jsonl in step order; InputError if there are none."""
    found = [p for p in (run_dir / VALIDATION_DIR).glob("*.jsonl") if p.stem.isdigit()]
    if not found:
        raise InputError(f"{run_dir / VALIDATION_DIR}: no <step>.jsonl validation dumps")
    return sorted(found, key=lambda p: int(p.stem))


def load_columns(inputs: Sequence[tuple[Path, str | None]]) -> tuple[list[Column], str | None]:
    """A column per (dump, label); a dump with a NaN or infinite score (a sick run's validation)
    is left out, named in the one line returned beside the columns. InputError for any other
    problem, or when every dump was left out."""
    columns: list[Column] = []
    left_out: list[tuple[str, str]] = []
    for path, label in inputs:
        try:
            columns.append(load_validation(path, label))
        except NotFiniteError as exc:
            left_out.append((label or path.stem, str(exc)))
    if not left_out:
        return columns, None
    names, first = ", ".join(name for name, _ in left_out), left_out[0][1]
    if not columns:
        raise InputError(f"no validation dump left: {names} hold a score not finite ({first})")
    return (
        columns,
        f"questions page: validation dumps {names} left out, a score not finite (first: {first})",
    )


def mean_share(column: Column) -> float:
    """The share of the column's answers the reward credited: verl's validation accuracy."""
    return sum(cell.share for cell in column.cells.values()) / len(column.cells)


def run_columns(run_dir: Path, step: str, prefix: str = "") -> tuple[list[Column], str | None]:
    """A run's columns: every validation step (``all``), the last (``last``), or the one with the
    highest accuracy, the earliest of equals (``best``; a step whose score is not finite is never
    it). InputError when the run has no usable dump."""
    if step not in STEPS:
        raise InputError(f"step choice {step!r}: use one of {', '.join(STEPS)}")
    paths = validation_steps(run_dir)
    if step == "last":
        paths = paths[-1:]
    columns, note = load_columns([(p, prefix + p.stem) for p in paths])
    if step == "best":
        columns = [max(columns, key=mean_share)]  # max keeps the first of equals
    return columns, note


def write_for_runs(
    run_dirs: Sequence[Path], out_dir: Path, step: str = "all"
) -> tuple[Path | None, str | None]:
    """Write out_dir/questions/questions.html from the runs' validation dumps (each run's steps
    as ``step`` chooses: all, last or best): (the page's path, None or the one line naming the
    steps left out) or (None, the one-line reason)."""
    try:
        columns: list[Column] = []
        notes: list[str] = []
        for run in run_dirs:
            prefix = f"{run.name}:" if len(run_dirs) > 1 else ""
            found, note = run_columns(run, step, prefix)
            columns += found
            notes += [note] if note else []
    except InputError as exc:
        return None, f"questions page not written: {exc}"
    return _write_page(columns, "; ".join(notes) or None, out_dir)


def write_for_evaluation(eval_dir: Path, baseline: str | None) -> tuple[Path | None, str | None]:
    """Write EVAL_DIR/questions/questions.html from every evaluated model's EvalScope reviews
    (mode ``training``, the prompt verl validates with, where it was run), ``baseline`` first:
    (the page's path, None) or (None, the one-line reason)."""
    try:
        has_mode = any((eval_dir / "evalscope").glob(f"*/{PREFERRED_MODE}/reviews"))
        inputs = evalscope_reviews(eval_dir, PREFERRED_MODE if has_mode else None, baseline)
        columns, note = load_columns(inputs)
    except InputError as exc:
        return None, f"questions page not written: {exc}"
    return _write_page(columns, note, eval_dir)


def _write_page(
    columns: list[Column], note: str | None, out_dir: Path
) -> tuple[Path | None, str | None]:
    table = build(columns)
    if not table["questions"]:
        return None, "questions page not written: no question is in every column"
    return write(columns, table, out_dir / DIR_NAME), note


def _model_order(label: str, baseline: str) -> tuple[int, int, str]:
    """the baseline first, then step-<N> by N, then any other model by name."""
    if label == baseline:
        return (0, 0, label)
    if label.startswith("step-") and label[5:].isdigit():
        return (1, int(label[5:]), label)
    return (2, 0, label)


def evalscope_reviews(
    eval_dir: Path, mode: str | None, baseline: str | None = None
) -> list[tuple[Path, str]]:
    """EvalScope's per-sample reviews under an evaluation folder (scripts/eval.sh's output, or a
    run's checkpoint_eval/ from ``eval.sh --run``): EVAL_DIR/evalscope/<model>/<mode>/reviews/
    <model>/gsm8k_main.jsonl, one (path, model) per model in order; InputError if none."""
    found = []
    root = eval_dir / "evalscope"
    for model_dir in sorted(root.iterdir()) if root.is_dir() else []:
        modes = sorted(p for p in model_dir.iterdir() if p.is_dir())
        chosen = [p for p in modes if mode is None or p.name == mode][:1]
        for mode_dir in chosen:
            review = mode_dir / "reviews" / model_dir.name / "gsm8k_main.jsonl"
            if review.is_file():
                found.append((review, model_dir.name))
    if not found:
        wanted = f" in mode {mode}" if mode else ""
        raise InputError(f"{root}: no EvalScope reviews (<model>/<mode>/reviews/){wanted}")
    return sorted(found, key=lambda item: _model_order(item[1], baseline or "baseline"))
