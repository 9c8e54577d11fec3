"""Reading the runs of a comparison: each through the run report's own analysis, with a unique
label, its config, its checkpoint evaluations, and the three x axes it can be drawn against.

Standard library only; the launch records are read by verl_gsm8k.common.launch_record, with PyYAML
(which verl's Hydra brings into the project's .venv).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.evals import EvalFile, read_checkpoint_evals
from verl_gsm8k.analysis.finding import Finding
from verl_gsm8k.analysis.parse import Canonical, InputError, RunData
from verl_gsm8k.compare.config import ConfigError, RunConfig, read_config
from verl_gsm8k.runpage import summary as rs

# The x axes a comparison offers: name -> what it counts.
AXES = {
    "step": "training step",
    "samples": "samples seen: step x data.train_batch_size x actor_rollout_ref.rollout.n",
    "wall_time": "wall time: cumulative step time (validation not included)",
}


class CompareError(Exception):
    """Input that cannot be compared: one line naming the file or run."""


@dataclass
class Run:
    """One compared run."""

    label: str
    path: Path
    data: RunData
    canon: Canonical
    findings: list[Finding]
    summary: dict[str, Any]
    config: RunConfig
    evals: EvalFile | None
    samples_per_step: int | None
    n_gpus: int | None
    wall_steps: list[int]  # steps with a step time, in order
    wall_until: list[float]  # seconds of step time up to and including each of wall_steps

    def x(self, axis: str, step: int) -> float | None:
        """Where ``step`` lies on ``axis``; None when this run cannot be placed on it."""
        if axis == "step":
            return float(step)
        if axis == "samples":
            return float(step * self.samples_per_step) if self.samples_per_step else None
        if not self.wall_steps:
            return None
        at = bisect.bisect_right(self.wall_steps, step)
        return self.wall_until[at - 1] if at else 0.0

    def why_not(self, axis: str) -> str | None:
        """Why this run is not drawn on ``axis`` (None when it is)."""
        if axis == "samples" and not self.samples_per_step:
            return f"{self.label}: no data.train_batch_size in its config ({self.config.source})"
        if axis == "wall_time" and not self.wall_steps:
            return f"{self.label}: no step time logged"
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def unique_labels(paths: Sequence[Path]) -> list[str]:
    """The run directory's name or the file's stem; the parent folder is added where two clash,
    then a number."""
    names = [(p.resolve().name if p.is_dir() else p.stem) or str(p) for p in paths]
    labels = [
        f"{p.resolve().parent.name}/{name}" if names.count(name) > 1 else name
        for p, name in zip(paths, names, strict=True)
    ]
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} ({seen[label]})")
    return out


def load_run(path: Path, label: str) -> Run:
    """Analyse one input as the run report does; CompareError when it cannot be compared."""
    if not path.exists():
        raise CompareError(f"input not found: {path}")
    try:
        data, canon, findings, summary = rs.analyse(path)
    except InputError as exc:
        raise CompareError(str(exc)) from None
    if not data.steps:
        detail = f" ({data.issues[0]})" if data.issues else ""
        raise CompareError(f"no metrics could be read from {path}{detail}")
    try:
        config = read_config(path, data.formats[0] if data.formats else "")
    except ConfigError as exc:
        raise CompareError(str(exc)) from None
    batch = _int(config.get("data.train_batch_size"))
    # Older verl had no rollout.n: one response per prompt.
    n = _int(config.get("actor_rollout_ref.rollout.n")) or 1
    gpus, nodes = _int(config.get("trainer.n_gpus_per_node")), _int(config.get("trainer.nnodes"))
    wall_steps: list[int] = []
    wall_until: list[float] = []
    total = 0.0
    for step, seconds in canon.series.get("step_time", []):
        total += seconds
        wall_steps.append(step)
        wall_until.append(total)
    return Run(
        label=label,
        path=path,
        data=data,
        canon=canon,
        findings=findings,
        summary=summary,
        config=config,
        evals=read_checkpoint_evals(path) if path.is_dir() else None,
        samples_per_step=batch * n if batch else None,
        n_gpus=gpus * (nodes or 1) if gpus else None,
        wall_steps=wall_steps,
        wall_until=wall_until,
    )


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Every input, checked: each exists and has metrics, none twice, some metric shared."""
    seen: dict[Path, Path] = {}
    for path in paths:
        resolved = path.resolve()
        if resolved in seen:
            raise CompareError(f"{seen[resolved]} and {path} are the same run ({resolved})")
        seen[resolved] = path
    runs = [load_run(p, label) for p, label in zip(paths, unique_labels(paths), strict=True)]
    if not shared_metrics(runs):
        logged = ", ".join(f"{r.label} ({len(r.canon.series)} metrics)" for r in runs)
        raise CompareError(f"the runs have no metric in common: {logged}")
    return runs


def shared_metrics(runs: Sequence[Run]) -> list[str]:
    """Canonical metrics every run logged."""
    names = set(runs[0].canon.series)
    for run in runs[1:]:
        names &= set(run.canon.series)
    return sorted(names)


def metrics_in_some_runs(runs: Sequence[Run]) -> dict[str, list[str]]:
    """Canonical metric -> the runs that logged it, for metrics not every run logged."""
    every = set(shared_metrics(runs))
    names = sorted({name for run in runs for name in run.canon.series} - every)
    return {name: [r.label for r in runs if name in r.canon.series] for name in names}


def table(run: Run) -> dict[str, Any]:
    """The comparison table's numbers for one run (None where the run does not tell)."""
    summary = run.summary
    val = summary["validation"]
    step_time = [v for _, v in run.canon.series.get("step_time", [])]
    wall = summary["time"]["wall_clock_s"] if step_time else None
    return {
        "val_first": val["first"],
        "val_best": val["best"],
        "val_last": val["final"],
        "train_score_final": summary["train_score"]["final"],
        "train_score_final_median_10": summary["train_score"]["final_median_10"],
        "steps": summary["steps"]["count"],
        "wall_time_s": wall,
        "mean_step_time_s": statistics.fmean(step_time) if step_time else None,
        "tokens_per_s": summary["throughput"]["tokens_per_s"],
        "tokens_per_s_estimated": summary["throughput"]["estimated"],
        "n_gpus": run.n_gpus,
        "gpu_hours": run.n_gpus * wall / 3600 if run.n_gpus and wall else None,
        # trainer.device (verl 0.9.1: cuda, npu or cpu); None in a console log without config
        "device": run.config.get("trainer.device"),
        "samples_per_step": run.samples_per_step,
    }
