"""The runs of a comparison, each read as the run report reads it, with its label and axes."""

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.evals import EvalFile, read_checkpoint_evals
from verl_gsm8k.analysis.finding import Finding
from verl_gsm8k.analysis.parse import Canonical, InputError, RunData
from verl_gsm8k.compare.config import ConfigError as CompareError
from verl_gsm8k.compare.config import RunConfig, read_config
from verl_gsm8k.runpage import summary as rs

AXES = {
    "step": "training step",
    "samples": "samples seen: step x data.train_batch_size x actor_rollout_ref.rollout.n",
    "wall_time": "wall time: cumulative step time (validation not included)",
}


def _count(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


@dataclass
class Run:
    label: str
    path: Path
    data: RunData
    canon: Canonical
    findings: list[Finding]
    summary: dict[str, Any]
    config: RunConfig
    evals: EvalFile | None

    def __post_init__(self) -> None:
        batch = _count(self.config.get("data.train_batch_size"))
        n = _count(self.config.get("actor_rollout_ref.rollout.n")) or 1
        self.samples_per_step = batch * n if batch else None
        gpus = _count(self.config.get("trainer.n_gpus_per_node"))
        self.n_gpus = gpus * (_count(self.config.get("trainer.nnodes")) or 1) if gpus else None
        times = self.canon.series.get("step_time", [])
        self.wall_steps = [s for s, _ in times]
        self.wall_until = list(accumulate(t for _, t in times))

    def x(self, axis: str, step: int) -> float | None:
        if axis == "step":
            return float(step)
        if axis == "samples":
            return float(step * self.samples_per_step) if self.samples_per_step else None
        at = bisect.bisect_right(self.wall_steps, step)
        return (self.wall_until[at - 1] if at else 0.0) if self.wall_steps else None

    def why_not(self, axis: str) -> str | None:
        if axis == "samples" and not self.samples_per_step:
            return f"{self.label}: no data.train_batch_size in its config ({self.config.source})"
        if axis == "wall_time" and not self.wall_steps:
            return f"{self.label}: no step time logged"
        return None


def unique_labels(paths: Sequence[Path]) -> list[str]:
    """The directory's name or the file's stem, its parent's where two clash, then a number."""
    names = [(p.resolve().name if p.is_dir() else p.stem) or str(p) for p in paths]
    labels = [f"{p.resolve().parent.name}/{name}" if names.count(name) > 1 else name
              for p, name in zip(paths, names, strict=True)]  # fmt: skip
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} ({seen[label]})")
    return out


def load_run(path: Path, label: str) -> Run:
    try:
        data, canon, findings, summary = rs.analyse(path)
        config = read_config(path, data.formats[0] if data.formats else "")
    except (InputError, rs.NothingReadError) as err:
        raise CompareError(str(err)) from None
    evals = read_checkpoint_evals(path) if path.is_dir() else None
    return Run(label, path, data, canon, findings, summary, config, evals)


def load_runs(paths: Sequence[Path]) -> list[Run]:
    seen: dict[Path, Path] = {}
    for path in paths:
        if path.resolve() in seen:
            raise CompareError(f"{seen[path.resolve()]} and {path} are the same run "
                               f"({path.resolve()})")  # fmt: skip
        seen[path.resolve()] = path
    runs = [load_run(p, label) for p, label in zip(paths, unique_labels(paths), strict=True)]
    if not shared_metrics(runs):
        logged = ", ".join(f"{r.label} ({len(r.canon.series)} metrics)" for r in runs)
        raise CompareError(f"the runs have no metric in common: {logged}")
    return runs


def shared_metrics(runs: Sequence[Run]) -> list[str]:
    return sorted(set.intersection(*(set(run.canon.series) for run in runs)))


def metrics_in_some_runs(runs: Sequence[Run]) -> dict[str, list[str]]:
    names = sorted({n for run in runs for n in run.canon.series} - set(shared_metrics(runs)))
    return {name: [r.label for r in runs if name in r.canon.series] for name in names}


def table(run: Run) -> dict[str, Any]:
    s, times = run.summary, [v for _, v in run.canon.series.get("step_time", [])]
    wall = s["time"]["wall_clock_s"] if times else None
    return {
        "val_first": s["validation"]["first"], "val_best": s["validation"]["best"],
        "val_last": s["validation"]["final"], "train_score_final": s["train_score"]["final"],
        "train_score_final_median_10": s["train_score"]["final_median_10"],
        "steps": s["steps"]["count"], "wall_time_s": wall,
        "mean_step_time_s": statistics.fmean(times) if times else None,
        "tokens_per_s": s["throughput"]["tokens_per_s"],
        "tokens_per_s_estimated": s["throughput"]["estimated"], "n_gpus": run.n_gpus,
        "gpu_hours": run.n_gpus * wall / 3600 if run.n_gpus and wall else None,
        "device": run.config.get("trainer.device"),
        "samples_per_step": run.samples_per_step,
    }  # fmt: skip
