"""The columns of runs and evaluations, and their questions page."""

from collections.abc import Sequence
from pathlib import Path

from verl_gsm8k.common.run_dir import VALIDATION_DIR, dump_files

from .page import write
from .table import Column, InputError, NotFiniteError, build, load_validation

DIR_NAME = "questions"
STEPS = ("all", "last", "best")
PREFERRED_MODE = "training"  # the evaluation mode with verl's validation prompt


def load_columns(inputs: Sequence[tuple[Path, str | None]]) -> tuple[list[Column], str | None]:
    """A column per (dump, label), and a line naming the dumps left out; else InputError."""
    columns, left_out = [], []
    for path, label in inputs:
        try:
            columns.append(load_validation(path, label))
        except NotFiniteError as err:
            left_out.append((label or path.stem, str(err)))
    if not left_out:
        return columns, None
    names, first = ", ".join(name for name, _ in left_out), left_out[0][1]
    if not columns:
        raise InputError(f"no validation dump left: {names} hold a score not finite ({first})")
    why = f"questions page: validation dumps {names} left out, a score not finite ({first})"
    return columns, why


def accuracy(column: Column) -> float:
    return sum(cell.share for cell in column.cells.values()) / len(column.cells)


def run_columns(run_dir: Path, step: str, prefix: str = "") -> tuple[list[Column], str | None]:
    """A run's columns: every validation step, the last, or the best (the earliest of equals)."""
    paths = list(dump_files(run_dir, VALIDATION_DIR).values())
    if not paths:
        raise InputError(f"{run_dir / VALIDATION_DIR}: no <step>.jsonl validation dumps")
    paths = paths[-1:] if step == "last" else paths
    columns, note = load_columns([(p, prefix + p.stem) for p in paths])
    if step == "best":  # max keeps the first of equals
        columns = [max(columns, key=accuracy)]
    return columns, note


def write_for_runs(run_dirs: Sequence[Path], out_dir: Path, step: str = "all"
                   ) -> tuple[Path | None, str | None]:  # fmt: skip
    """OUT/questions/questions.html: (the page, a note or None), or (None, the reason)."""
    try:
        found = [run_columns(run, step, f"{run.name}:" * (len(run_dirs) > 1)) for run in run_dirs]
    except InputError as err:
        return None, f"questions page not written: {err}"
    notes = "; ".join(note for _, note in found if note) or None
    return _write(sum((columns for columns, _ in found), []), notes, out_dir)


def write_for_evaluation(eval_dir: Path, baseline: str | None) -> tuple[Path | None, str | None]:
    """EVAL_DIR/questions/questions.html from each model's EvalScope reviews."""
    try:
        has_mode = any((eval_dir / "evalscope").glob(f"*/{PREFERRED_MODE}/reviews"))
        inputs = evalscope_reviews(eval_dir, PREFERRED_MODE if has_mode else None, baseline)
        columns, note = load_columns(inputs)
    except InputError as err:
        return None, f"questions page not written: {err}"
    return _write(columns, note, eval_dir)


def _write(columns: list[Column], note: str | None, out: Path) -> tuple[Path | None, str | None]:
    table = build(columns)
    if not table["questions"]:
        return None, "questions page not written: no question is in every column"
    return write(columns, table, out / DIR_NAME), note


def evalscope_reviews(eval_dir: Path, mode: str | None, baseline: str | None = None
                      ) -> list[tuple[Path, str]]:  # fmt: skip
    """(review file, model) per model: the baseline, step-<N> by N, the others by name."""
    root, found = eval_dir / "evalscope", []
    for model in sorted(root.iterdir()) if root.is_dir() else []:
        modes = sorted(p for p in model.iterdir() if p.is_dir() and mode in (None, p.name))
        review = modes[0] / "reviews" / model.name / "gsm8k_main.jsonl" if modes else None
        if review and review.is_file():
            found.append((review, model.name))
    if not found:
        wanted = f" in mode {mode}" if mode else ""
        raise InputError(f"{root}: no EvalScope reviews (<model>/<mode>/reviews/){wanted}")

    def order(item: tuple[Path, str]) -> tuple[int, int, str]:
        name = item[1]
        step = name[5:].isdecimal() and name.startswith("step-")
        rank = 0 if name == (baseline or "baseline") else 1 if step else 2
        return rank, int(name[5:]) if step else 0, name

    return sorted(found, key=order)
