"""The questions page of one or several run directories, for the run report and the comparison."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .page import write
from .table import InputError, build, load_validation

DIR_NAME = "questions"  # the page's folder beside report.html / comparison.html


def validation_steps(run_dir: Path) -> list[Path]:
    """RUN_DIR/validation/<step>.jsonl in step order; InputError if there are none."""
    found = [p for p in (run_dir / "validation").glob("*.jsonl") if p.stem.isdigit()]
    if not found:
        raise InputError(f"{run_dir / 'validation'}: no <step>.jsonl validation dumps")
    return sorted(found, key=lambda p: int(p.stem))


def write_for_runs(
    run_dirs: Sequence[Path], out_dir: Path, last_only: bool
) -> tuple[Path | None, str | None]:
    """Write out_dir/questions/questions.html from the runs' validation dumps (every step of
    each run, or each run's last step): (the page's path, None) or (None, the one-line reason)."""
    try:
        inputs: list[tuple[Path, str]] = []
        for run in run_dirs:
            steps = validation_steps(run)
            steps = steps[-1:] if last_only else steps
            prefix = f"{run.name}:" if len(run_dirs) > 1 else ""
            inputs += [(p, prefix + p.stem) for p in steps]
        columns = [load_validation(p, label) for p, label in inputs]
    except InputError as exc:
        return None, f"questions page not written: {exc}"
    table = build(columns)
    if not table["questions"]:
        return None, "questions page not written: no question is in every validation dump"
    return write(columns, table, out_dir / DIR_NAME), None
